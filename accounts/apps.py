from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Tenancy and access"

    def ready(self) -> None:
        # Registers the OpenAPI description of Bearer API keys with drf-spectacular.
        from accounts.api import schema  # noqa: F401
