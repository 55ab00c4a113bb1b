"""/api/docs/ (Swagger UI) works without internet: its scripts, styles and icon are our static files."""

import re
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from django.test import Client

pytestmark = pytest.mark.django_db


def test_swagger_ui_loads_nothing_from_another_host() -> None:
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    urls = re.findall(r'(?:src|href)="([^"]+)"', response.content.decode())
    assert len(urls) >= 4  # icon, stylesheet, bundle, preset
    static_prefix = "/" + settings.STATIC_URL.lstrip("/")
    for url in urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, url  # no CDN
        assert parts.path.startswith(static_prefix), url
        assert finders.find(parts.path.removeprefix(static_prefix)), url  # collectstatic serves it
