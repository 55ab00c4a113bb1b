"""Thin page views: resolve what the user may see, ask selectors, render."""

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal import dashboard as dashboard_snapshot
from portal.access import dashboard_scope, org_view_for, visible_orgs
from portal.balances import org_balances
from portal.consumers import DASHBOARD_WS_PATH, pull_interval_seconds
from portal.job_costs import job_costs
from portal.selectors import own_jobs, user_jobs
from scheduling import job_reads
from scheduling.fleet_report import org_quotas
from scheduling.models import JobState
from scheduling.selectors import standings_of

JOBS_SHOWN = 50


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The signed-in user's balances in every org/project they belong to, and their jobs."""
    orgs = [org_balances(view, request.user) for view in visible_orgs(request.user)]
    jobs = list(user_jobs(user=request.user, limit=JOBS_SHOWN))
    # QA: the list stopped at 50 without saying so. Counted only when the page is full.
    jobs_total = own_jobs(user=request.user).count() if len(jobs) == JOBS_SHOWN else len(jobs)
    queued = [job for job in jobs if job.state == JobState.QUEUED]
    if queued:  # where each stands in the queue (the API's GET /jobs/{id}/priority, cached)
        found = standings_of(queued)
        for job in queued:
            standing = found.by_job[job.pk]
            job.queue_position = standing.position if standing else None
            job.queue_length = found.queue_length
    return render(
        request,
        "portal/home.html",
        {
            "orgs": orgs,
            "jobs": jobs,
            "jobs_total": jobs_total,
        },
    )


@require_GET
@login_required
def org_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """One org's balances and concurrent-GPU quotas; 404 (not 403) for orgs the user does not belong to."""
    view = org_view_for(request.user, slug)
    if view is None:
        raise Http404("No such organization.")
    projects = None if view.sees_whole_org else {project.pk for project in view.projects}
    return render(
        request,
        "portal/org.html",
        {
            "org": org_balances(view, request.user),
            "quotas": org_quotas(view.org, projects),
        },
    )


@require_GET
@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job as `GET /api/v1/jobs/{id}` shows it (same reads: `scheduling.job_reads`): what it
    asked for, why it waits or how it ended, and what it cost, attempt by attempt. 404 for a job
    of a project the user does not see."""
    jobs = job_reads.visible_jobs(request.user).select_related("org", "project", "user")
    job = job_reads.job_detail(request.user, job_id, jobs)
    if job is None:
        raise Http404("No such job.")
    if job.state == JobState.QUEUED:
        found = standings_of([job])
        standing = found.by_job[job.pk]
        job.queue_position = standing.position if standing else None
        job.queue_length = found.queue_length
    return render(request, "portal/job.html", {"job": job, **job_costs(job)})


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """The live dashboard (finance/staff: every org; org owners/admins: their orgs)."""
    scope = dashboard_scope(request.user)
    if scope is None:
        # A portal page with the nav, saying who may see it (QA: a bare "403 Forbidden" page).
        return render(request, "portal/dashboard_forbidden.html", status=403)
    snapshot = dashboard_snapshot.for_scope(dashboard_snapshot.build_snapshot(), scope)
    return render(
        request,
        "portal/dashboard.html",
        {
            "snapshot": snapshot,
            "ws_path": DASHBOARD_WS_PATH,
            "all_orgs": scope.all_orgs,
            "pull_seconds": pull_interval_seconds(),
        },
    )
