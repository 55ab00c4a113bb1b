"""API v1 routes, gathered from each app's api package."""

from django.urls import include, path

urlpatterns = [
    path("", include("accounts.api.urls")),
    path("", include("budgets.api.urls")),
    path("", include("ledger.api.urls")),
    path("", include("scheduling.api.urls")),
    path("agent/", include("metering.api.urls")),
]
