"""`make run`'s demo data and traffic: the commands work on an empty database and exercise the
features they advertise (here: dependent evaluation jobs)."""

import io

import pytest
from django.core.management import call_command

from scheduling.models import Dependency, Job

pytestmark = pytest.mark.django_db


def test_seed_then_traffic_submits_jobs_and_dependent_evaluations() -> None:
    call_command("seed_demo", verbosity=0)
    out = io.StringIO()
    call_command("demo_traffic", count=40, every=0, seed=7, stdout=out)
    assert "(afterok " in out.getvalue()
    assert Job.objects.count() >= 40
    evals = Job.objects.filter(name__startswith="demo-eval-after-").prefetch_related("depends_on")
    assert evals, "no dependent job in 40 submissions"
    for job in evals:
        (parent,) = job.depends_on.all()
        assert job.name == f"demo-eval-after-{parent.pk}" and job.dependency == Dependency.AFTER_OK
        assert job.wait_reason == "dependency"  # nothing ran yet: every parent is still queued
