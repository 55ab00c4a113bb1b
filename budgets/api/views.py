"""`GET`/`PUT` budgets at org, project and member-in-project level (org owners/admins, finance)."""

from abc import ABC, abstractmethod
from typing import Any

from django.contrib.auth import get_user_model
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.models import Membership, Organization, Project
from accounts.selectors import get_visible_org, get_visible_project, require_org_manager
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
    def scope(self, request: Request, **kwargs: Any) -> tuple[Organization, Project | None, Any]:
        """The (org, project, user) this route's budget belongs to, visible to the caller or 404."""

    def _get(self, request: Request, **kwargs: Any) -> Response:
        no_query(request)
        org, project, user = self.scope(request, **kwargs)
        budget = Budget.objects.filter(org=org, project=project, user=user).first()
        if budget is None:
            raise Http404("No budget at this level.")
        return Response(_render(budget))

    def _put(self, request: Request, **kwargs: Any) -> Response:
        key_of(request)
        org, project, user = self.scope(request, **kwargs)
        require_org_manager(request.user, org)
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
    def scope(self, request: Request, **kwargs: Any) -> tuple[Organization, Project | None, Any]:
        return get_visible_org(request.user, kwargs["org_id"]), None, None

    @extend_schema(operation_id="orgs_budget_retrieve", **_GET)
    def get(self, request: Request, org_id: int) -> Response:
        return self._get(request, org_id=org_id)

    @extend_schema(operation_id="orgs_budget_set", **_PUT)
    def put(self, request: Request, org_id: int) -> Response:
        return self._put(request, org_id=org_id)


class ProjectBudgetView(_BudgetView):
    def scope(self, request: Request, **kwargs: Any) -> tuple[Organization, Project | None, Any]:
        project = get_visible_project(request.user, kwargs["project_id"])
        return project.org, project, None

    @extend_schema(operation_id="projects_budget_retrieve", **_GET)
    def get(self, request: Request, project_id: int) -> Response:
        return self._get(request, project_id=project_id)

    @extend_schema(operation_id="projects_budget_set", **_PUT)
    def put(self, request: Request, project_id: int) -> Response:
        return self._put(request, project_id=project_id)


class MemberBudgetView(_BudgetView):
    def scope(self, request: Request, **kwargs: Any) -> tuple[Organization, Project | None, Any]:
        project = get_visible_project(request.user, kwargs["project_id"])
        if not Membership.objects.filter(project=project, user_id=kwargs["user_id"]).exists():
            raise NotFound(f"User {kwargs['user_id']} is not a member of project {project.pk}; a member "
                           "budget is for one of its members (an org owner who submits jobs without "
                           "being a member is bounded by the project and org budgets).")
        return project.org, project, get_user_model().objects.get(pk=kwargs["user_id"])

    @extend_schema(operation_id="projects_member_budget_retrieve", **_GET)
    def get(self, request: Request, project_id: int, user_id: int) -> Response:
        return self._get(request, project_id=project_id, user_id=user_id)

    @extend_schema(operation_id="projects_member_budget_set", **_PUT)
    def put(self, request: Request, project_id: int, user_id: int) -> Response:
        return self._put(request, project_id=project_id, user_id=user_id)
