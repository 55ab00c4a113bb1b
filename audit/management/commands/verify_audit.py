"""Recompute every audit hash chain; exit non-zero listing each break."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.verification import verify_chains


class Command(BaseCommand):
    help = "Verify every audit event chain (sequence, predecessor hash, content hash, head)."

    def handle(self, *args: Any, **options: Any) -> None:
        problems = verify_chains()
        if problems:
            for line in problems:
                self.stderr.write(line)
            raise CommandError(f"audit verification found {len(problems)} break(s)")
        self.stdout.write(self.style.SUCCESS("audit OK: every chain verifies"))
