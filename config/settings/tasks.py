"""Celery: Redis broker in production, a file-system broker (no server) when embedded."""

from config.env import BASE_DIR, env

from .database import REDIS_URL

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {"visibility_timeout": 3600}
else:
    _queue = BASE_DIR / "var" / "celery"
    for _folder in ("out", "processed", "control"):
        (_queue / _folder).mkdir(parents=True, exist_ok=True)
    # kombu's filesystem transport, writing each message atomically (config/celery_filesystem.py).
    CELERY_BROKER_URL = "gpubankfs://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue / "out"),
        "data_folder_out": str(_queue / "out"),
        "processed_folder": str(_queue / "processed"),
        "control_folder": str(_queue / "control"),
        "store_processed": False,
    }

CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(BASE_DIR / "var" / "celerybeat-schedule")
# Beat schedules are declared by each app in config/celery.py (code, not database).
