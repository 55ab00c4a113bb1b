"""A refused slug or month says what is expected (QA: "This value does not match the required
pattern."), and an org creation with several bad fields names them all."""

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from tests.api.conftest import client_for
from tests.api.factories import Tenant
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
SLUG_MESSAGE = "Lowercase letters, digits and inner dashes, 1-64 characters (e.g. ml-team)."
MONTH_MESSAGE = "A month as YYYY-MM, e.g. 2026-11."


def _post(client: APIClient, url: str, body: dict[str, Any]) -> Any:
    return client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)


@pytest.fixture
def finance() -> APIClient:
    user = UserFactory()
    user.groups.add(Group.objects.get_or_create(name="finance")[0])
    return client_for(user)


def test_a_bad_slug_says_what_a_slug_is(finance: APIClient, tenant: Tenant) -> None:
    org = _post(finance, "/api/v1/orgs", {"name": "Bad", "slug": "bad slug"})
    assert org.status_code == 400 and org.json()["errors"] == {"slug": [SLUG_MESSAGE]}
    admin = client_for(tenant.admin)
    for slug in ("Ünï", "-edge", 7):
        project = _post(admin, f"/api/v1/orgs/{tenant.org.pk}/projects", {"name": "P", "slug": slug})
        assert project.status_code == 400 and project.json()["errors"] == {"slug": [SLUG_MESSAGE]}, slug


def test_a_bad_slug_and_an_unknown_owner_are_both_reported(finance: APIClient, fleet: dict) -> None:
    body = {"name": "Bad", "slug": "bad slug", "owner": "nobody-here", "home_region": "mars"}
    errors = _post(finance, "/api/v1/orgs", body).json()["errors"]
    assert errors == {"slug": [SLUG_MESSAGE], "owner": ["No such active user to make owner."],
                      "home_region": ["Unknown region."]}


def test_a_bad_month_says_what_a_month_is(tenant: Tenant) -> None:
    admin = client_for(tenant.admin)
    for month in ("abc", "11/2026", "\uff12\uff10\uff12\uff16-11"):
        response = admin.get(f"/api/v1/orgs/{tenant.org.pk}/statement", {"month": month})
        assert response.status_code == 400 and response.json()["errors"] == {"month": [MONTH_MESSAGE]}, month
