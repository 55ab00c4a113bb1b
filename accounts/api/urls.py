"""Tenancy routes under `/api/v1/`."""

from django.urls import path

from accounts.api.keys import ApiKeyRevokeView, ApiKeysView
from accounts.api.views import (
    OrgDetailView,
    OrgListCreateView,
    OrgProjectsView,
    ProjectDetailView,
    ProjectMembersView,
)

urlpatterns = [
    path("orgs", OrgListCreateView.as_view(), name="orgs"),
    path("orgs/<int:org_id>", OrgDetailView.as_view(), name="org-detail"),
    path("orgs/<int:org_id>/projects", OrgProjectsView.as_view(), name="org-projects"),
    path("projects/<int:project_id>", ProjectDetailView.as_view(), name="project-detail"),
    path("projects/<int:project_id>/members", ProjectMembersView.as_view(), name="project-members"),
    path("api-keys", ApiKeysView.as_view(), name="api-keys"),
    path("api-keys/<int:key_id>/revoke", ApiKeyRevokeView.as_view(), name="api-key-revoke"),
]
