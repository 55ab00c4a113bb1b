"""Budget routes under `/api/v1/`."""

from django.urls import path

from budgets.api.views import MemberBudgetView, OrgBudgetView, ProjectBudgetView

urlpatterns = [
    path("orgs/<int:org_id>/budget", OrgBudgetView.as_view(), name="org-budget"),
    path("projects/<int:project_id>/budget", ProjectBudgetView.as_view(), name="project-budget"),
    path("projects/<int:project_id>/members/<int:user_id>/budget", MemberBudgetView.as_view(),
         name="member-budget"),
]
