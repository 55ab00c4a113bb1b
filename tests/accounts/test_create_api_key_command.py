"""`manage.py create_api_key`: the expiry is 1 to 3650 days or absent (never expires)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from accounts.models import ApiKey
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("days", ["0", "-1", "3651", "99999999"])
def test_an_expiry_out_of_range_is_refused_without_a_traceback(days: str) -> None:
    """QA: 0 made a key that never expires; -1 and 99999999 printed tracebacks (AccountsError,
    OverflowError). A CommandError is printed as one line by manage.py."""
    user = UserFactory()
    with pytest.raises(CommandError, match="--expires-days must be 1 to 3650"):
        call_command("create_api_key", user.username, "--name", "ci", "--expires-days", days,
                     stdout=StringIO())
    assert not ApiKey.objects.filter(user=user).exists()


@pytest.mark.parametrize("days", [1, 3650])
def test_an_expiry_in_range_is_that_many_days_ahead(days: int) -> None:
    user = UserFactory()
    out = StringIO()
    call_command("create_api_key", user.username, "--name", "ci", "--expires-days", str(days), stdout=out)
    key = ApiKey.objects.get(user=user)
    assert out.getvalue().strip().startswith(f"gpub_{key.prefix}_")
    expected = timezone.now() + timedelta(days=days)
    assert expected - timedelta(minutes=1) < key.expires_at <= expected


def test_without_the_option_the_key_never_expires() -> None:
    user = UserFactory()
    call_command("create_api_key", user.username, "--name", "ci", stdout=StringIO())
    assert ApiKey.objects.get(user=user).expires_at is None


def test_a_name_the_service_refuses_is_a_command_error() -> None:
    user = UserFactory()
    with pytest.raises(CommandError, match="1-100 characters"):
        call_command("create_api_key", user.username, "--name", "x" * 101, stdout=StringIO())
