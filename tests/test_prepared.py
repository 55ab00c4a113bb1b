"""config.prepared: hot-path statements prepared server-side, with what Django's cursor gives."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from accounts.models import Organization
from config import prepared

pytestmark = pytest.mark.django_db(transaction=True)

_SELECT = "SELECT name FROM accounts_organization WHERE slug = %s"


def test_prepared_once_then_reused_and_logged() -> None:
    Organization.objects.create(name="Acme", slug="acme")
    with CaptureQueriesContext(connection) as queries:
        assert prepared.execute(_SELECT, ["acme"]) == ("Acme",)
        assert prepared.execute(_SELECT, ["nope"]) is None
    assert [q["sql"] for q in queries.captured_queries] == [
        f"{_SELECT} -- ['acme']", f"{_SELECT} -- ['nope']"
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = %s",
                       [_SELECT.replace("%s", "$1")])
        assert cursor.fetchone() == (1,)


def test_runs_in_the_callers_transaction_and_wraps_errors() -> None:
    insert = ("INSERT INTO accounts_organization (name, slug, fair_share_weight, "
              "max_inflight_submissions, created_at) VALUES (%s, %s, 1, 16, now())")
    org = Organization.objects.create(name="Acme", slug="acme")
    with transaction.atomic():
        with pytest.raises(IntegrityError):  # Django's class: unique slug
            prepared.execute(insert, ["Again", "acme"], fetch="none")
        transaction.set_rollback(True)
    with transaction.atomic():
        prepared.execute("UPDATE accounts_organization SET name = %s WHERE id = %s", ["Gone", org.pk],
                         fetch="none")
        transaction.set_rollback(True)  # the statement was part of this transaction
    org.refresh_from_db()
    assert org.name == "Acme"


def test_execute_wrappers_see_the_statement() -> None:
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append((sql, list(params), context["connection"].alias))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        prepared.execute(_SELECT, ["x"])
    assert seen == [(_SELECT, ["x"], "default")]
