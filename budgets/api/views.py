"""`GET`/`PUT` budgets at org, project and member-in-project level.

Setting any budget, and reading a project's or a member's, is for org owners/admins and finance;
a member reads their own; the org's budget is org-wide money, read by whoever may read the org's
balance (docs/api.md)."""

from abc import ABC, abstractmethod
from typing import Any

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.models import Membership, Organization, Project
from accounts.selectors import (
    get_visible_org,
    get_visible_project,
    require_org_manager,
    require_org_reader,
)
from budgets.api.serializers import BudgetInputSerializer, BudgetSerializer
from budgets.models import Budget
from budgets.selectors import current_period
from budgets.services import set_budget
from config.api.idempotency import key_of, run_idempotent
from config.api.ratelimit import enforce_org_limit
from config.api.serializers import no_query


def _render(budget: Budget) -> dict:
    return BudgetSerializer(budget, context={"current_period": current_period(budget)}).data


class _BudgetView(GenericAPIView, ABC):
    serializer_class = BudgetSerializer

    @abstractmethod
    def scope(self, request: Request, **kwargs: Any) -> tuple[Organization, Project | None]:
        """The (org, project) this route's budget belongs to, visible to the caller or 404."""

    def member(self, request: Request, project: Project | None, **kwargs: Any) -> Any:
        """The member of a member-in-project budget (None above that level); asked only once the
        caller may read or set it, so a 404 here tells no one else who is a member."""
        return None

    def require_reader(self, request: Request, org: Organization, **kwargs: Any) -> None:
        """Who may read this level's budget: org owners/admins and finance, as for setting it
        (visibility alone let a project-only member read it, QA)."""
        require_org_manager(request.user, org)

    def _get(self, request: Request, **kwargs: Any) -> Response:
        no_query(request)
        org, project = self.scope(request, **kwargs)
        self.require_reader(request, org, **kwargs)
        user = self.member(request, project, **kwargs)
        budget = Budget.objects.filter(org=org, project=project, user=user).first()
        if budget is None:
            raise NotFound("No budget at this level.")
        return Response(_render(budget))

    def _put(self, request: Request, **kwargs: Any) -> Response:
        key_of(request)
        org, project = self.scope(request, **kwargs)
        require_org_manager(request.user, org)
        user = self.member(request, project, **kwargs)
        enforce_org_limit(request, org_id=org.pk, scope="default")
        body = BudgetInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)

        def effect() -> tuple[int, Any]:
            budget, created = set_budget(org=org, project=project, user=user, actor=request.user,
                                         **body.validated_data)
            return (201 if created else 200), _render(budget)

        return run_idempotent(request, effect)


_GET = {"responses": BudgetSerializer}
_PUT = {"request": BudgetInputSerializer, "responses": {200: BudgetSerializer, 201: BudgetSerializer}}


class OrgBudgetView(_BudgetView):
    def scope(self, request: Request, **kwargs: Any) -> tuple[Organization, Project | None]:
        return get_visible_org(request.user, kwargs["org_id"]), None

    def require_reader(self, request: Request, org: Organization, **kwargs: Any) -> None:
        """The org's held and spent are org-wide money: what `/orgs/{id}/balance` requires (org
        members and finance; a project-only member gets 403, QA)."""
        require_org_reader(request.user, org, "its budget")

    @extend_schema(operation_id="orgs_budget_retrieve", **_GET)
    def get(self, request: Request, org_id: int) -> Response:
        return self._get(request, org_id=org_id)

    @extend_schema(operation_id="orgs_budget_set", **_PUT)
    def put(self, request: Request, org_id: int) -> Response:
        return self._put(request, org_id=org_id)


class ProjectBudgetView(_BudgetView):
    def scope(self, request: Request, **kwargs: Any) -> tuple[Organization, Project | None]:
        project = get_visible_project(request.user, kwargs["project_id"])
        return project.org, project

    @extend_schema(operation_id="projects_budget_retrieve", **_GET)
    def get(self, request: Request, project_id: int) -> Response:
        return self._get(request, project_id=project_id)

    @extend_schema(operation_id="projects_budget_set", **_PUT)
    def put(self, request: Request, project_id: int) -> Response:
        return self._put(request, project_id=project_id)


class MemberBudgetView(_BudgetView):
    def scope(self, request: Request, **kwargs: Any) -> tuple[Organization, Project | None]:
        project = get_visible_project(request.user, kwargs["project_id"])
        return project.org, project

    def member(self, request: Request, project: Project | None, **kwargs: Any) -> Any:
        # The user by primary key first, as every route finds its object: Django answers an id
        # beyond the column's range with no row there, where `user_id=` on the membership's
        # foreign key sent it to the database (QA: a 500 OverflowError on SQLite for 2**63).
        user = get_user_model().objects.filter(pk=kwargs["user_id"]).first()
        if user is None or not Membership.objects.filter(project=project, user=user).exists():
            raise NotFound(f"User {kwargs['user_id']} is not a member of project {project.pk}; a member "
                           "budget is for one of its members (an org owner who submits jobs without "
                           "being a member is bounded by the project and org budgets).")
        return user

    def require_reader(self, request: Request, org: Organization, **kwargs: Any) -> None:
        """A member reads their own budget too (QA: a member refused `budget-exceeded` could not
        see the budget that refused them); anyone else's, owners/admins and finance."""
        if kwargs["user_id"] == request.user.pk:
            return  # `member` still answers 404 unless they are a member of the project
        super().require_reader(request, org)

    @extend_schema(operation_id="projects_member_budget_retrieve", **_GET)
    def get(self, request: Request, project_id: int, user_id: int) -> Response:
        return self._get(request, project_id=project_id, user_id=user_id)

    @extend_schema(operation_id="projects_member_budget_set", **_PUT)
    def put(self, request: Request, project_id: int, user_id: int) -> Response:
        return self._put(request, project_id=project_id, user_id=user_id)
