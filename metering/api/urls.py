"""Agent API routes, mounted at /api/v1/agent/ (config/api_urls.py)."""

from django.urls import path

from metering.api import views

app_name = "agent"

urlpatterns = [
    path("register", views.register, name="register"),
    path("assignments", views.pull_assignments, name="assignments"),
    path("heartbeats", views.heartbeats, name="heartbeats"),
    path("attempts/<int:attempt_id>/started", views.started, name="started"),
    path("attempts/<int:attempt_id>/exit", views.exit_report, name="exit"),
]
