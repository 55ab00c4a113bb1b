"""Org, project and membership management (finance creates orgs; org owners/admins the rest)."""

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.api.serializers import (
    MemberAddSerializer,
    MembershipSerializer,
    OrganizationCreateSerializer,
    OrganizationSerializer,
    ProjectCreateSerializer,
    ProjectMemberSerializer,
    ProjectSerializer,
)
from accounts.selectors import (
    get_visible_org,
    get_visible_project,
    org_projects,
    project_members,
    require_finance,
    require_org_manager,
    visible_orgs,
)
from accounts.services import add_project_member, create_organization, create_project
from config.api.idempotency import key_of, run_idempotent
from config.api.ratelimit import enforce_org_limit
from config.api.serializers import PageQuerySerializer, no_query, query_of


class OrgListCreateView(GenericAPIView):
    serializer_class = OrganizationSerializer

    def get_throttles(self) -> list:
        self.rate_limit_scope = "finance" if self.request.method == "POST" else "default"
        return super().get_throttles()

    @extend_schema(operation_id="orgs_list", parameters=[PageQuerySerializer],
                   responses=OrganizationSerializer(many=True))
    def get(self, request: Request) -> Response:
        PageQuerySerializer(data=query_of(request)).is_valid(raise_exception=True)
        page = self.paginate_queryset(visible_orgs(request.user).order_by("id"))
        return self.get_paginated_response(OrganizationSerializer(page, many=True).data)

    @extend_schema(operation_id="orgs_create", request=OrganizationCreateSerializer,
                   responses={201: OrganizationSerializer}, description="Finance only.")
    def post(self, request: Request) -> Response:
        key_of(request)
        require_finance(request.user)
        body = OrganizationCreateSerializer(data=request.data)  # finds the home region and the owner
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)

        def effect() -> tuple[int, Any]:
            org = create_organization(actor=request.user, **data)
            return 201, OrganizationSerializer(org).data

        return run_idempotent(request, effect)


class OrgDetailView(GenericAPIView):
    serializer_class = OrganizationSerializer

    @extend_schema(operation_id="orgs_retrieve", responses=OrganizationSerializer)
    def get(self, request: Request, org_id: int) -> Response:
        no_query(request)
        return Response(OrganizationSerializer(get_visible_org(request.user, org_id)).data)


class OrgProjectsView(GenericAPIView):
    serializer_class = ProjectSerializer

    @extend_schema(operation_id="orgs_projects_list", parameters=[PageQuerySerializer],
                   responses=ProjectSerializer(many=True),
                   description="The org's projects the caller sees: all of them for org members and "
                   "finance, their own for a member of projects only.")
    def get(self, request: Request, org_id: int) -> Response:
        PageQuerySerializer(data=query_of(request)).is_valid(raise_exception=True)
        org = get_visible_org(request.user, org_id)
        page = self.paginate_queryset(org_projects(request.user, org))
        return self.get_paginated_response(ProjectSerializer(page, many=True).data)

    @extend_schema(operation_id="orgs_projects_create", request=ProjectCreateSerializer,
                   responses={201: ProjectSerializer}, description="Org owners/admins and finance.")
    def post(self, request: Request, org_id: int) -> Response:
        key_of(request)
        org = get_visible_org(request.user, org_id)
        require_org_manager(request.user, org)
        enforce_org_limit(request, org_id=org.pk, scope="default")
        body = ProjectCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)

        def effect() -> tuple[int, Any]:
            project = create_project(org=org, actor=request.user, **body.validated_data)
            return 201, ProjectSerializer(project).data

        return run_idempotent(request, effect)


class ProjectDetailView(GenericAPIView):
    serializer_class = ProjectSerializer

    @extend_schema(operation_id="projects_retrieve", responses=ProjectSerializer)
    def get(self, request: Request, project_id: int) -> Response:
        no_query(request)
        return Response(ProjectSerializer(get_visible_project(request.user, project_id)).data)


class ProjectMembersView(GenericAPIView):
    serializer_class = MembershipSerializer

    @extend_schema(operation_id="projects_members_list", parameters=[PageQuerySerializer],
                   responses=ProjectMemberSerializer(many=True),
                   description="The project's members (user id, username, project role); for whoever "
                   "sees the project.")
    def get(self, request: Request, project_id: int) -> Response:
        PageQuerySerializer(data=query_of(request)).is_valid(raise_exception=True)
        project = get_visible_project(request.user, project_id)
        page = self.paginate_queryset(project_members(project))
        return self.get_paginated_response(ProjectMemberSerializer(page, many=True).data)

    @extend_schema(operation_id="projects_members_add", request=MemberAddSerializer,
                   responses={200: MembershipSerializer, 201: MembershipSerializer},
                   description="Add a user to a project (or change their role); org owners/admins.")
    def post(self, request: Request, project_id: int) -> Response:
        key_of(request)
        project = get_visible_project(request.user, project_id)
        require_org_manager(request.user, project.org)
        enforce_org_limit(request, org_id=project.org_id, scope="default")
        body = MemberAddSerializer(data=request.data, context={"org_id": project.org_id})
        body.is_valid(raise_exception=True)
        user, role = body.validated_data["user_obj"], body.validated_data["role"]

        def effect() -> tuple[int, Any]:
            membership, created = add_project_member(project=project, user=user, role=role,
                                                     actor=request.user)
            return (201 if created else 200), MembershipSerializer(membership).data

        return run_idempotent(request, effect)
