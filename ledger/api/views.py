"""Balances, the journal and credit issuance: thin views over ledger selectors and services."""

from datetime import datetime
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from accounts.models import Organization
from accounts.selectors import (
    get_visible_org,
    get_visible_project,
    require_finance,
    require_org_reader,
    visible_projects,
)
from config.api.idempotency import key_of, run_idempotent
from config.api.ratelimit import enforce_org_limit
from config.api.serializers import query_of
from ledger.api.csv_renderer import StatementCsvRenderer
from ledger.api.serializers import (
    BalanceQuerySerializer,
    BalanceSerializer,
    BucketSerializer,
    CreditIssueSerializer,
    StatementQuerySerializer,
    StatementSerializer,
    TransactionQuerySerializer,
    TransactionSerializer,
)
from ledger.clock import ledger_now
from ledger.selectors import balance_breakdown, org_transactions
from ledger.services import issue_credits
from ledger.statements import org_statement


def _as_of(request: Request) -> datetime | None:
    """The balance routes' query: `as_of` or nothing (400 for anything else, as on every route)."""
    query = BalanceQuerySerializer(data=query_of(request))
    query.is_valid(raise_exception=True)
    return query.validated_data.get("as_of")


def _org_money_reader(request: Request, org_id: int) -> Organization:
    """The org, for a caller who may read its money (members and finance), within its rate limit."""
    org = get_visible_org(request.user, org_id)
    require_org_reader(request.user, org)
    enforce_org_limit(request, org_id=org.pk, scope="default")
    return org


class OrgBalanceView(GenericAPIView):
    serializer_class = BalanceSerializer

    @extend_schema(operation_id="orgs_balance", parameters=[BalanceQuerySerializer],
                   responses=BalanceSerializer)
    def get(self, request: Request, org_id: int) -> Response:
        as_of = _as_of(request)
        org = _org_money_reader(request, org_id)
        return Response(BalanceSerializer(balance_breakdown(org=org, as_of=as_of)).data)


class ProjectBalanceView(GenericAPIView):
    serializer_class = BalanceSerializer

    @extend_schema(operation_id="projects_balance", parameters=[BalanceQuerySerializer],
                   responses=BalanceSerializer,
                   description="What the project can spend: its own buckets and the org-wide ones (their "
                   "totals include other projects' holds and spending on the shared buckets), and "
                   "`project_usage`: what this project's own jobs hold and have spent.")
    def get(self, request: Request, project_id: int) -> Response:
        as_of = _as_of(request)
        project = get_visible_project(request.user, project_id)
        enforce_org_limit(request, org_id=project.org_id, scope="default")
        breakdown = balance_breakdown(org=project.org, project=project, as_of=as_of)
        return Response(BalanceSerializer(breakdown).data)


class OrgTransactionsView(GenericAPIView):
    serializer_class = TransactionSerializer

    @extend_schema(
        operation_id="orgs_transactions",
        parameters=[TransactionQuerySerializer],
        responses=TransactionSerializer(many=True),
    )
    def get(self, request: Request, org_id: int) -> Response:
        org = _org_money_reader(request, org_id)
        query = TransactionQuerySerializer(data=query_of(request))
        query.is_valid(raise_exception=True)
        filters = {k: query.validated_data.get(k) for k in ("since", "until", "kind")}
        journal = org_transactions(org=org, **filters)
        page = self.paginate_queryset(journal)
        return self.get_paginated_response(TransactionSerializer(page, many=True).data)


class OrgStatementView(GenericAPIView):
    serializer_class = StatementSerializer
    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, StatementCsvRenderer]

    def handle_exception(self, exc: Exception) -> Response:
        """Errors stay problem+json even when the statement was asked for as CSV."""
        response = super().handle_exception(exc)
        self.request.accepted_renderer = self.renderer_classes[0]()
        self.request.accepted_media_type = self.request.accepted_renderer.media_type
        return response

    @extend_schema(
        operation_id="orgs_statement", parameters=[StatementQuerySerializer],
        responses={(200, "application/json"): StatementSerializer, (200, "text/csv"): OpenApiTypes.STR},
        description="The org's statement for one month (UTC): opening and closing balance, what was "
        "issued, consumed (per project and GPU type, with GPU-hours), expired and voided. Org members "
        "and finance. `?format=csv` (or `Accept: text/csv`) gives it as a spreadsheet.",
    )
    def get(self, request: Request, org_id: int) -> Response:
        org = _org_money_reader(request, org_id)
        query = StatementQuerySerializer(data=query_of(request))
        query.is_valid(raise_exception=True)
        month = query.validated_data.get("month") or ledger_now().strftime("%Y-%m")
        try:
            statement = org_statement(org=org, month=month)
        except ValueError as error:
            raise ValidationError({"month": [str(error)]}) from None
        return Response(StatementSerializer(statement).data)


class OrgCreditsView(GenericAPIView):
    serializer_class = BucketSerializer
    rate_limit_scope = "finance"

    @extend_schema(operation_id="orgs_credits_issue", request=CreditIssueSerializer,
                   responses={201: BucketSerializer, 200: BucketSerializer},
                   description="Finance only: issue a purchase, grant or promotion as a new bucket. "
                   "Issuing is idempotent by reference: the same reference and terms again answer 200 "
                   "with the existing bucket and `already_issued: true`.")
    def post(self, request: Request, org_id: int) -> Response:
        key_of(request)
        org = get_visible_org(request.user, org_id)
        require_finance(request.user)
        body = CreditIssueSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        project = None
        project_id = data.pop("project", None)  # absent or null: the whole org
        if project_id is not None:
            # A field of the body: an unknown project is a 400 naming it, not the route's 404 (QA);
            # another org's project too, under `errors.project` like it (QA: no `errors` at all).
            project = visible_projects(request.user).filter(pk=project_id).first()
            if project is None:
                raise ValidationError({"project": ["No such project."]})
            if project.org_id != org.pk:
                raise ValidationError({"project": ["The project belongs to another organization."]})

        def effect() -> tuple[int, Any]:
            bucket = issue_credits(org=org, project=project, actor=request.user, **data)
            # The reference was issued before with the same terms: nothing new (QA: said 201).
            return (200 if getattr(bucket, "replayed", False) else 201), BucketSerializer(bucket).data

        return run_idempotent(request, effect)
