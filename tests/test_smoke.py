"""The project boots on PostgreSQL and answers its health check."""

import pytest
from django.db import connection


@pytest.mark.django_db
def test_database_is_postgresql(client) -> None:
    assert connection.vendor == "postgresql"
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
