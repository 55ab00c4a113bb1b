"""A query datetime whose `+` the client did not URL-encode (`?as_of=…T04:26:00+00:00`) arrives with
a space where the offset's sign was: still a 400, but one that says to send `%2B` (or `Z`).

QA: the generic "Datetime has wrong format. Use one of these formats instead: …[+HH:MM|-HH:MM|Z]"
confused clients that had sent +HH:MM. One field (`config.api.serializers.AwareDateTimeField`, in
a query serializer) answers it for every query datetime.
"""

from __future__ import annotations

import pytest

from budgets.api.serializers import BudgetInputSerializer
from tests.api.conftest import client_for
from tests.api.factories import Tenant

pytestmark = pytest.mark.django_db
PLUS_MESSAGE = ("The + of the UTC offset arrived as a space: in a query string an unencoded + means a space. "
                "Send it as %2B (e.g. 2026-11-22T03:40:00%2B01:00), or give the time in UTC with Z.")
UNENCODED = ["2026-11-23T04:26:00+00:00", "2026-11-23T04:26:00.123+05:30", "2026-11-23 04:26+0100"]


def _routes(tenant: Tenant) -> list[tuple[str, str]]:
    return [(f"/api/v1/orgs/{tenant.org.pk}/balance", "as_of"),
            (f"/api/v1/projects/{tenant.project.pk}/balance", "as_of"),
            ("/api/v1/jobs", "submitted_since"), ("/api/v1/jobs", "submitted_until"),
            (f"/api/v1/orgs/{tenant.org.pk}/transactions", "since")]


@pytest.mark.parametrize("value", UNENCODED)
def test_an_unencoded_plus_is_a_400_that_says_to_send_2b(tenant: Tenant, value: str) -> None:
    admin = client_for(tenant.admin)
    for url, name in _routes(tenant):
        response = admin.get(f"{url}?{name}={value}")  # raw: the + is read as a space
        assert response.status_code == 400, (url, response.content)
        assert response.json()["errors"] == {name: [PLUS_MESSAGE]}, url


def test_the_encoded_plus_and_z_are_accepted(tenant: Tenant) -> None:
    admin = client_for(tenant.admin)
    for value in ("2026-01-01T00:00:00%2B00:00", "2026-01-01T00:00:00Z"):
        for url, name in _routes(tenant):
            response = admin.get(f"{url}?{name}={value}")
            assert response.status_code == 200, (url, response.content)


def test_other_bad_values_keep_their_message(tenant: Tenant) -> None:
    admin = client_for(tenant.admin)
    response = admin.get(f"/api/v1/orgs/{tenant.org.pk}/balance?as_of=yesterday 00:00")
    [error] = response.json()["errors"]["as_of"]
    assert error.startswith("Datetime has wrong format")


def test_a_body_datetime_is_not_told_about_query_strings() -> None:
    """In a JSON body a + is a +: a space there is just a wrong format."""
    body = BudgetInputSerializer(data={"period": "window", "limit": 1, "enforcement": "soft",
                                       "window_start": "2026-11-23T04:26:00 00:00",
                                       "window_end": "2026-11-24T04:26:00Z"})
    assert not body.is_valid()
    [error] = body.errors["window_start"]
    assert error.startswith("Datetime has wrong format")


def test_a_naive_query_time_is_told_to_encode_its_offset_and_an_impossible_offset_gets_no_plus_hint(
    tenant: Tenant,
) -> None:
    """QA: the no-offset message suggested a bare `+01:00`, the very mistake the hint warns about,
    and `+99:00` (invalid however it is encoded) was told to send %2B."""
    admin = client_for(tenant.admin)
    naive = admin.get("/api/v1/jobs?submitted_since=2026-11-23T05:00:00").json()["errors"]
    assert naive == {"submitted_since": [
        "Give the time with its UTC offset, e.g. 2026-11-22T03:40:00Z or, with the + encoded as in any "
        "query string, 2026-11-22T03:40:00%2B01:00."]}
    impossible = admin.get("/api/v1/jobs?submitted_since=2026-11-23T05:00:00+99:00").json()["errors"]
    assert impossible["submitted_since"] != [PLUS_MESSAGE]
