from django.apps import AppConfig


class PortalConfig(AppConfig):
    """Browser pages for users and finance: balances, jobs and the live dashboard (read-only)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "portal"
