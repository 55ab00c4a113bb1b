"""Storage settings the scheduler's write phase relies on (PostgreSQL)."""

import pytest
from django.db import connection
from django.utils import timezone


@pytest.mark.django_db
def test_job_pages_keep_room_for_hot_wait_reason_updates():
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'scheduling_job'")
        (options,) = cursor.fetchone()
    assert "fillfactor=80" in (options or [])


@pytest.mark.django_db
def test_wait_reason_columns_are_not_indexed():
    """A HOT update needs every changed column to be outside all indexes."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'scheduling_job'")
        definitions = [row[0] for row in cursor.fetchall()]
    assert definitions
    assert not [d for d in definitions if "wait_reason" in d or "wait_detail" in d]


@pytest.mark.django_db
def test_wait_reason_update_is_heap_only(make_job):
    """The writer's wait-reason UPDATE adds no index entries (on these few-row pages it would be
    HOT whatever the fillfactor; the fillfactor keeps it so on packed pages)."""
    from scheduling.adapter.writer import _write_wait_reasons

    jobs = [make_job() for _ in range(3)]

    def hot_updates() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
                           "WHERE relname = 'scheduling_job'")
            return cursor.fetchone()

    updated, hot = hot_updates()
    start = timezone.now()  # an expected start is written in the same UPDATE, also unindexed
    _write_wait_reasons([(job.pk, "resources", "no node fits", start) for job in jobs])
    assert hot_updates() == (updated + 3, hot + 3)
