"""Project configuration package; exposes the Celery app so workers find it."""

from .celery import app as celery_app

__all__ = ["celery_app"]
