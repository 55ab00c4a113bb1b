"""The Celery app. Beat schedules are declared here, in code."""

import os

from celery import Celery, signals
from celery.schedules import crontab

from config import celery_filesystem
from config.env import env

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
celery_filesystem.register()  # the embedded mode's broker (config/settings/tasks.py)

app = Celery("gpubank")


@signals.worker_init.connect(weak=False)
@signals.beat_init.connect(weak=False)
def _setup_telemetry(sender: object = None, **kwargs: object) -> None:
    # Only in worker and beat processes (web processes import this app too); prefork children
    # inherit the provider, and the SDK restarts its export thread after the fork.
    from config.telemetry import setup_telemetry

    setup_telemetry(role="celery-beat" if "beat" in str(sender).lower() else "celery-worker")

app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Every periodic job, in one place. Each task is idempotent and safe to run twice at once.
app.conf.beat_schedule = {
    # Live dashboard push; a missed tick is harmless (the next one, or the consumer's pull, follows).
    "portal-dashboard-snapshot": {
        "task": "portal.tasks.broadcast_dashboard",
        "schedule": 5.0,
        "options": {"expires": 5},
    },
    # Idempotency records are kept >= IDEMPOTENCY_KEY_TTL_SECONDS (24 h), then deleted.
    "accounts-reap-idempotency-keys": {
        "task": "accounts.tasks.reap_idempotency_keys",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
    # Window budgets set before their window began are counted from their scope's activity
    # when it begins (budgets/services.py: open_started_windows); cheap when none is due.
    "budgets-open-windows": {
        "task": "budgets.tasks.open_budget_windows",
        "schedule": 5.0,
        "options": {"expires": 5},
    },
    # Scheduler: one pass per tick under a leader lock (a duplicate beat returns at once).
    "scheduling-tick": {
        "task": "scheduling.tasks.scheduler_tick",
        "schedule": env.float("SCHEDULER_TICK_SECONDS", default=5.0),
        "options": {"expires": env.float("SCHEDULER_TICK_SECONDS", default=5.0)},
    },
    "scheduling-sweep-nodes": {
        "task": "scheduling.tasks.sweep_nodes",
        "schedule": 15.0,
        "options": {"expires": 15},
    },
    "scheduling-fund-waiting-jobs": {
        "task": "scheduling.tasks.fund_waiting_jobs",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "scheduling-cancel-orphaned-dependents": {
        "task": "scheduling.tasks.cancel_orphaned_dependents",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    # Metering (metering/tasks.py): progress captures and hold extensions, stranded holds, the
    # expiry sweep, nightly reconciliation. Expiry is shorter than any visibility timeout.
    "metering-charge-progress": {
        "task": "metering.tasks.charge_progress",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "metering-release-stranded-holds": {
        "task": "metering.tasks.release_stranded_holds",
        "schedule": 300.0,
        "options": {"expires": 300},
    },
    "metering-expire-buckets": {
        "task": "metering.tasks.expire_buckets",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "metering-reconcile-nightly": {
        "task": "metering.tasks.reconcile",
        "schedule": crontab(hour=3, minute=17),
        "options": {"expires": 3600},
    },
}
