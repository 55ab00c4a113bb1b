"""Ledger routes under `/api/v1/`."""

from django.urls import path

from ledger.api.views import (
    OrgBalanceView,
    OrgCreditsView,
    OrgStatementView,
    OrgTransactionsView,
    ProjectBalanceView,
)

urlpatterns = [
    path("orgs/<int:org_id>/balance", OrgBalanceView.as_view(), name="org-balance"),
    path("orgs/<int:org_id>/transactions", OrgTransactionsView.as_view(), name="org-transactions"),
    path("orgs/<int:org_id>/credits", OrgCreditsView.as_view(), name="org-credits"),
    path("orgs/<int:org_id>/statement", OrgStatementView.as_view(), name="org-statement"),
    path("projects/<int:project_id>/balance", ProjectBalanceView.as_view(), name="project-balance"),
]
