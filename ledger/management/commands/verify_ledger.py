"""Rebuild every bucket from postings and check the journal; exit non-zero on any difference."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.verification import verify_ledger


class Command(BaseCommand):
    help = "Check that every transaction sums to zero and buckets/holds match their postings."

    def handle(self, *args: Any, **options: Any) -> None:
        problems = verify_ledger()
        if problems:
            for line in problems:
                self.stderr.write(line)
            raise CommandError(f"ledger verification found {len(problems)} difference(s)")
        self.stdout.write(self.style.SUCCESS("ledger OK: journal balanced, buckets and holds match postings"))
