"""`manage.py demo_traffic`: keep the demo busy with a stream of short jobs from the demo users.

Jobs go through the same submission service as the API (holds, budgets, audit). Commands are short
sleeps so the fake fleet runs them to completion; a few are larger gang or high-priority jobs so
backfill and preemption show up on the dashboard, and some standard jobs are followed by an
evaluation job that depends on them (afterok), so dependencies show up too.
"""

import random
import time
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from accounts.models import Membership
from config.errors import DomainError
from scheduling.services.submission import JobSpec, submit_job

SHAPES = [
    # weight, gpu types, gpu count, priority class, sleep seconds range
    (6, ("A100", "H100"), 1, "standard", (5, 20)),
    (4, ("L4",), 1, "interactive", (3, 10)),
    (3, ("H100",), 4, "batch", (15, 40)),
    (2, ("H100", "A100"), 2, "premium", (10, 25)),
    (1, ("H100",), 8, "production", (20, 40)),
]


class Command(BaseCommand):
    help = "Submit a steady stream of short demo jobs (Ctrl-C to stop)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--every", type=float, default=4.0, help="seconds between submissions")
        parser.add_argument("--count", type=int, default=0, help="stop after N jobs (0 = forever)")
        parser.add_argument("--seed", type=int, default=7)

    def handle(self, *args: Any, **options: Any) -> None:
        rng = random.Random(options["seed"])
        members = list(Membership.objects.select_related("user", "project__org"))
        if not members:
            self.stderr.write("No memberships: run `manage.py seed_demo` first.")
            return
        weights = [shape[0] for shape in SHAPES]
        submitted = 0
        while not options["count"] or submitted < options["count"]:
            member = rng.choice(members)
            _, types, count, cls, (low, high) = rng.choices(SHAPES, weights=weights)[0]
            seconds = rng.randint(low, high)
            spec = JobSpec(
                name=f"demo-{cls}-{count}x{types[0]}",
                gpu_types=types,
                gpu_count=count,
                max_wall_seconds=seconds * 3,
                priority_class=cls,
                command=f"sleep {seconds}",
            )
            try:
                with transaction.atomic():  # a refusal (e.g. globex's production jobs) undoes only itself
                    job = submit_job(
                        user=member.user, project=member.project, spec=spec,
                        idempotency_key=f"demo-{uuid.uuid4()}",
                    )
                self.stdout.write(f"submitted job {job.pk} {spec.name} for {member.project}")
                if cls == "standard" and rng.random() < 0.3:  # a pipeline: evaluate once it completes
                    self._submit_eval(member, job.pk, rng)
            except DomainError as error:
                self.stdout.write(f"rejected {spec.name} for {member.project}: {error.detail}")
            submitted += 1
            time.sleep(options["every"])

    def _submit_eval(self, member: Any, after: int, rng: random.Random) -> None:
        seconds = rng.randint(3, 10)
        spec = JobSpec(name=f"demo-eval-after-{after}", gpu_types=("L4", "A100"), gpu_count=1,
                       max_wall_seconds=seconds * 3, priority_class="standard", command=f"sleep {seconds}",
                       depends_on=(after,))
        job = submit_job(user=member.user, project=member.project, spec=spec,
                         idempotency_key=f"demo-{uuid.uuid4()}")
        self.stdout.write(f"submitted job {job.pk} {spec.name} (afterok {after})")
