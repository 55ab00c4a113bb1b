"""API v1 routes, gathered from each app's api package."""

from django.urls import include, path, re_path

from config.api.views import api_not_found

# The busiest routes first (job submission, then the agents'): a request is matched against the
# patterns in order, and no two apps' patterns overlap, so the order changes nothing else.
urlpatterns = [
    path("", include("scheduling.api.urls")),
    path("agent/", include("metering.api.urls")),
    path("", include("accounts.api.urls")),
    path("", include("budgets.api.urls")),
    path("", include("ledger.api.urls")),
    # Anything else under /api/v1/ is a problem-details 404, not Django's HTML page (keep last).
    # Any path, newlines included (`.` stops at one: "/api/v1/jobs/%0A" got Django's HTML 404).
    re_path(r"^[\s\S]*$", api_not_found),
]
