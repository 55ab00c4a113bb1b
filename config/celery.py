"""The Celery app. Beat schedules are declared here, in code."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpubank")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Every periodic job, in one place. Each task is idempotent and safe to run twice at once.
app.conf.beat_schedule = {}
