"""Budget tasks run by Celery beat."""

from celery import shared_task

from budgets.services import open_started_windows


@shared_task(acks_late=True, ignore_result=True)
def open_budget_windows() -> int:
    """Count the periods of window budgets whose window has just begun (idempotent)."""
    return open_started_windows()
