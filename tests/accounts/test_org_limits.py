"""An org's max in-flight submissions (1 to 10,000) and hold window (at most 30 days) keep the API's
bounds on every path: admin form, model validation, database.

QA: the admin saved `max_inflight_submissions` 0 (then every POST /jobs of the org was 429 for
ever) and hold windows of 2,592,001 s and more, all of which the API refuses.
"""

from __future__ import annotations

from importlib import import_module

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.urls import reverse

from accounts.api.serializers import OrganizationCreateSerializer
from accounts.models import (
    HOLD_WINDOW_MAX_MESSAGE,
    INFLIGHT_SUBMISSIONS_MESSAGE,
    MAX_HOLD_WINDOW_SECONDS,
    MAX_INFLIGHT_SUBMISSIONS,
    MIN_INFLIGHT_SUBMISSIONS,
    Organization,
)
from tests.factories import OrganizationFactory

pytestmark = pytest.mark.django_db


def _post(client: Client, org: Organization, **fields: str) -> object:
    form = {
        "name": org.name, "slug": org.slug, "home_region": "", "fair_share_weight": "1",
        "hold_window_seconds": "600", "max_inflight_submissions": "16",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
    } | fields
    return client.post(reverse("admin:accounts_organization_change", args=[org.pk]), form)


@pytest.fixture
def superuser_client(client: Client, django_user_model: type) -> Client:
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.mark.parametrize("inflight", ["0", "10001", "2147483648", "-1"])
def test_the_admin_refuses_inflight_out_of_range(superuser_client: Client, inflight: str) -> None:
    org = OrganizationFactory(hold_window_seconds=600, max_inflight_submissions=16)
    response = _post(superuser_client, org, max_inflight_submissions=inflight)
    assert response.status_code == 200  # the form again, with the error; nothing saved
    errors = response.context["adminform"].form.errors
    # Its own message only (QA: -1 said "greater than or equal to 0", as if 0 were allowed).
    assert errors["max_inflight_submissions"] == [INFLIGHT_SUBMISSIONS_MESSAGE]
    org.refresh_from_db()
    assert org.max_inflight_submissions == 16


@pytest.mark.parametrize("window", ["2592001", "2147483648", "9223372036854775807"])
def test_the_admin_refuses_a_window_over_30_days(superuser_client: Client, window: str) -> None:
    org = OrganizationFactory(hold_window_seconds=600)
    response = _post(superuser_client, org, hold_window_seconds=window)
    assert response.status_code == 200
    assert HOLD_WINDOW_MAX_MESSAGE in response.context["adminform"].form.errors["hold_window_seconds"]
    org.refresh_from_db()
    assert org.hold_window_seconds == 600


def test_the_admin_gives_a_negative_window_the_windows_own_message(superuser_client: Client) -> None:
    from accounts.models import HOLD_WINDOW_MESSAGE

    org = OrganizationFactory(hold_window_seconds=600)
    response = _post(superuser_client, org, hold_window_seconds="-5")
    assert response.context["adminform"].form.errors["hold_window_seconds"] == [HOLD_WINDOW_MESSAGE]
    org.refresh_from_db()
    assert org.hold_window_seconds == 600


@pytest.mark.parametrize(("inflight", "window"), [("1", "2592000"), ("10000", "60")])
def test_the_admin_saves_the_bounds(superuser_client: Client, inflight: str, window: str) -> None:
    org = OrganizationFactory(hold_window_seconds=600)
    response = _post(superuser_client, org, max_inflight_submissions=inflight, hold_window_seconds=window)
    assert response.status_code == 302
    org.refresh_from_db()
    assert (org.max_inflight_submissions, org.hold_window_seconds) == (int(inflight), int(window))


INFLIGHT_CHECK = "org_max_inflight_submissions_in_range"


@pytest.mark.parametrize(("field", "value", "message", "check"), [
    ("max_inflight_submissions", 0, INFLIGHT_SUBMISSIONS_MESSAGE, INFLIGHT_CHECK),
    ("max_inflight_submissions", 10_001, INFLIGHT_SUBMISSIONS_MESSAGE, INFLIGHT_CHECK),
    ("hold_window_seconds", 2_592_001, HOLD_WINDOW_MAX_MESSAGE, "org_hold_window_at_most_30_days"),
])
def test_model_validation_and_the_database_refuse_it(
    field: str, value: int, message: str, check: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Organization(name="Acme", slug="acme", **{field: value}).full_clean()
    assert message in refused.value.message_dict[field]
    org = OrganizationFactory()
    with pytest.raises(IntegrityError, match=check), transaction.atomic():
        Organization.objects.filter(pk=org.pk).update(**{field: value})


def test_the_api_and_the_model_share_the_bounds() -> None:
    fields = OrganizationCreateSerializer().fields
    assert (fields["max_inflight_submissions"].min_value, fields["max_inflight_submissions"].max_value) == (
        MIN_INFLIGHT_SUBMISSIONS, MAX_INFLIGHT_SUBMISSIONS)
    assert fields["hold_window_seconds"].max_value == MAX_HOLD_WINDOW_SECONDS


def test_the_migration_clamps_existing_orgs_into_range() -> None:
    migration = import_module("accounts.migrations.0007_org_limits_in_range_data")
    rows = [(0, 600), (1, 2_592_000), (16, 2_592_001), (10_001, 2_147_483_647), (10_000, None)]
    orgs = [OrganizationFactory() for _ in rows]
    checks = [c for c in Organization._meta.constraints
              if c.name in {"org_hold_window_at_most_30_days", "org_max_inflight_submissions_in_range"}]
    assert len(checks) == 2
    with connection.schema_editor() as editor:  # inside the test's transaction: rolled back after
        editor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for check in checks:
            editor.remove_constraint(Organization, check)
        for org, (inflight, window) in zip(orgs, rows, strict=True):
            Organization.objects.filter(pk=org.pk).update(max_inflight_submissions=inflight,
                                                          hold_window_seconds=window)
        migration._clamp_org_limits(apps, editor)
        for check in checks:
            editor.add_constraint(Organization, check)
    after = [tuple(Organization.objects.filter(pk=org.pk).values_list(
        "max_inflight_submissions", "hold_window_seconds").get()) for org in orgs]
    assert after == [(1, 600), (1, 2_592_000), (16, 2_592_000), (10_000, 2_592_000), (10_000, None)]
