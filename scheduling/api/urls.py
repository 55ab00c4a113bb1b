"""`/api/v1/jobs` routes, the fair-share and quota reports, and the GPU types on offer."""

from django.urls import path

from scheduling.api.views import (
    GpuTypesView,
    JobCancelView,
    JobDetailView,
    JobHoldView,
    JobListCreateView,
    JobPriorityView,
    JobReleaseView,
    OrgFairShareView,
    OrgQuotasView,
)

urlpatterns = [
    path("jobs", JobListCreateView.as_view(), name="jobs"),
    path("jobs/<int:job_id>", JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/cancel", JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/priority", JobPriorityView.as_view(), name="job-priority"),
    path("jobs/<int:job_id>/hold", JobHoldView.as_view(), name="job-hold"),
    path("jobs/<int:job_id>/release", JobReleaseView.as_view(), name="job-release"),
    path("orgs/<int:org_id>/fair-share", OrgFairShareView.as_view(), name="org-fair-share"),
    path("orgs/<int:org_id>/quotas", OrgQuotasView.as_view(), name="org-quotas"),
    path("gpu-types", GpuTypesView.as_view(), name="gpu-types"),
]
