"""The admin is branded and its static files exist in a clean checkout."""

import pytest
from django.contrib.staticfiles import finders


def test_project_static_files_are_found() -> None:
    assert finders.find("favicon.svg") is not None


@pytest.mark.django_db
def test_admin_is_branded(admin_client) -> None:
    response = admin_client.get("/admin/")
    assert response.status_code == 200
    assert b"GPU Bank administration" in response.content
