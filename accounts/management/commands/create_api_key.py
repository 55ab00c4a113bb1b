"""`manage.py create_api_key USERNAME --name NAME [--expires-days N]` prints a new key once."""

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from accounts.services import AccountsError, create_api_key

# Ten years: a longer expiry is a typo (QA: 99999999 overflowed the date with a traceback).
MAX_EXPIRES_DAYS = 3650


class Command(BaseCommand):
    help = "Create an API key for a user and print it (it is stored hashed and never shown again)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", required=True)
        parser.add_argument("--expires-days", type=int, default=None,
                            help=f"1 to {MAX_EXPIRES_DAYS}; without it the key never expires.")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user {options['username']!r}.")
        days = options["expires_days"]
        # QA: `--expires-days 0` made a key that never expires (0 was read as "no expiry"), and
        # negative or huge values printed tracebacks. Only leaving the option out means no expiry.
        if days is not None and not 1 <= days <= MAX_EXPIRES_DAYS:
            raise CommandError(f"--expires-days must be 1 to {MAX_EXPIRES_DAYS} (leave it out for a key "
                               "that never expires).")
        expires_at = timezone.now() + timedelta(days=days) if days is not None else None
        try:
            # No actor: whoever runs the shell has no account here, so the event's actor is the system.
            _key, raw = create_api_key(user=user, name=options["name"], expires_at=expires_at, actor=None)
        except AccountsError as error:  # e.g. a name over 100 characters
            raise CommandError(error.detail) from None
        self.stdout.write(raw)
