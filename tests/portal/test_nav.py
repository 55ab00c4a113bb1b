"""The portal's navigation is the same on every page, and the dashboard's refusal is a portal page.

QA: the job page dropped the "Live dashboard" link for users allowed to see the dashboard (its
view did not set `can_see_dashboard`, which the other views each set; now one context processor,
`portal.context_processors.portal_nav`, sets it for every page); and `/dashboard/` answered a user
who may not see it a bare "403 Forbidden" page with no navigation.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import OrgMembership, OrgRole
from tests.portal.conftest import World

pytestmark = pytest.mark.django_db
DASHBOARD_LINK = '<a href="/dashboard/">Live dashboard</a>'


def _client(user: object) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _pages(world: World) -> list[str]:
    return [reverse("portal:home"), reverse("portal:org", args=[world.acme.slug]),
            reverse("portal:job", args=[world.job.pk]), reverse("portal:api-keys"),
            reverse("portal:dashboard")]


def test_every_page_links_the_dashboard_for_who_may_see_it(world: World) -> None:
    OrgMembership.objects.filter(org=world.acme, user=world.alice).update(role=OrgRole.ADMIN)
    client = _client(world.alice)
    for url in _pages(world):
        response = client.get(url)
        assert response.status_code == 200, url
        assert DASHBOARD_LINK in response.content.decode(), url


def test_no_page_links_the_dashboard_for_who_may_not(world: World) -> None:
    client = _client(world.alice)  # a member of acme, no owner or admin: no dashboard
    for url in _pages(world)[:-1]:
        response = client.get(url)
        assert response.status_code == 200, url
        assert "Live dashboard" not in response.content.decode(), url


@pytest.mark.parametrize("who", ["alice", "dave"])
def test_the_dashboard_refuses_with_a_portal_page(world: World, who: str) -> None:
    response = _client(getattr(world, who)).get(reverse("portal:dashboard"))
    assert response.status_code == 403
    html = response.content.decode()
    assert f'href="{reverse("portal:home")}">Balances</a>' in html  # the nav
    assert 'href="/api-keys/">API keys</a>' in html and "Sign out" in html
    assert "The live dashboard is for the finance group, staff, and the owners and admins" in html
    assert DASHBOARD_LINK not in html  # no link to what it refuses


def test_a_page_that_is_not_found_is_a_portal_page_and_an_api_route_stays_a_problem(world: World) -> None:
    """QA: another org's job, an unknown job or org answered Django's bare "Not Found" page, with no
    navigation, beside the portal's own 403 page."""
    client = _client(world.alice)
    for url in ("/jobs/999999/", "/orgs/nosuch/", "/no/such/page/"):
        response = client.get(url)
        assert response.status_code == 404, url
        html = response.content.decode()
        assert f'href="{reverse("portal:home")}">Balances</a>' in html and "Sign out" in html, url
        assert "<h1>Not found</h1>" in html and url in html
    api = client.get("/api/v1/no-such-route")
    assert api.status_code == 404 and api["Content-Type"].startswith("application/problem+json")
    assert Client().get("/no/such/page/").status_code == 404  # signed out: the page, no nav
