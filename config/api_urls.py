"""API v1 routes, gathered from each app's api package."""

from django.urls import include, path

urlpatterns: list = [
    path("agent/", include("metering.api.urls")),
]
