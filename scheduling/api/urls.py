"""`/api/v1/jobs` routes, the fair-share and quota reports, the GPU types on offer and the priority
classes."""

from django.urls import path

from scheduling.api.views import (
    GpuTypesView,
    JobCancelView,
    JobDetailView,
    JobHoldView,
    JobListCreateView,
    JobPriorityView,
    JobRefundView,
    JobReleaseView,
    OrgFairShareView,
    OrgQuotasView,
    PriorityClassesView,
)

urlpatterns = [
    path("jobs", JobListCreateView.as_view(), name="jobs"),
    path("jobs/<int:job_id>", JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/cancel", JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/priority", JobPriorityView.as_view(), name="job-priority"),
    path("jobs/<int:job_id>/hold", JobHoldView.as_view(), name="job-hold"),
    path("jobs/<int:job_id>/release", JobReleaseView.as_view(), name="job-release"),
    path("jobs/<int:job_id>/refund", JobRefundView.as_view(), name="job-refund"),
    path("orgs/<int:org_id>/fair-share", OrgFairShareView.as_view(), name="org-fair-share"),
    path("orgs/<int:org_id>/quotas", OrgQuotasView.as_view(), name="org-quotas"),
    path("gpu-types", GpuTypesView.as_view(), name="gpu-types"),
    path("priority-classes", PriorityClassesView.as_view(), name="priority-classes"),
]
