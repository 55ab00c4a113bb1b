"""`manage.py create_api_key USERNAME --name NAME [--expires-days N]` prints a new key once."""

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from accounts.services import create_api_key


class Command(BaseCommand):
    help = "Create an API key for a user and print it (it is stored hashed and never shown again)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", required=True)
        parser.add_argument("--expires-days", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user {options['username']!r}.")
        days = options["expires_days"]
        expires_at = timezone.now() + timedelta(days=days) if days else None
        _key, raw = create_api_key(user=user, name=options["name"], expires_at=expires_at)
        self.stdout.write(raw)
