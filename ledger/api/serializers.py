"""Shapes of balances, journal entries and credit issuance."""

from datetime import datetime
from typing import Any

from rest_framework import serializers

from config.api.serializers import (
    MAX_AMOUNT,
    AwareDateTimeField,
    QueryDigitsField,
    StrictCharField,
    StrictIntegerField,
    StrictQuerySerializer,
    StrictSerializer,
)
from ledger.clock import ledger_now
from ledger.models import BucketKind, BucketSource, LedgerTransaction, Posting, TransactionKind
from ledger.services.issuance import reference_problem
from ledger.statements import MONTH_MESSAGE, MONTH_PATTERN


class AmountsSerializer(serializers.Serializer):
    granted = serializers.IntegerField()
    available = serializers.IntegerField()
    held = serializers.IntegerField()
    spent = serializers.IntegerField()
    expired = serializers.IntegerField()
    voided = serializers.IntegerField()
    spendable = serializers.IntegerField(help_text="Available in buckets that are active now.")


class ExpiringSerializer(serializers.Serializer):
    """Available + held in active buckets expiring within 7 and 30 days."""

    def get_fields(self) -> dict:
        return {"7d": serializers.IntegerField(), "30d": serializers.IntegerField()}


class BucketBalanceSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=BucketKind.choices)
    source = serializers.ChoiceField(choices=BucketSource.choices)
    project = serializers.IntegerField(allow_null=True)
    gpu_types = serializers.ListField(child=serializers.CharField())
    effective_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    closed_at = serializers.DateTimeField(allow_null=True, help_text="When finance closed it (its expiry "
                                          "moved to then); null before, or if never closed.")
    reference = serializers.CharField()
    status = serializers.ChoiceField(choices=["active", "expired", "not_yet_effective"])
    spendable = serializers.IntegerField()
    granted = serializers.IntegerField()
    available = serializers.IntegerField()
    held = serializers.IntegerField()
    spent = serializers.IntegerField()
    expired = serializers.IntegerField()
    voided = serializers.IntegerField()


class ProjectUsageSerializer(serializers.Serializer):
    """A project's own holds, apart from the shared buckets' totals."""

    held = serializers.IntegerField(help_text="Still held by this project's holds (its unfinished jobs).")
    spent = serializers.IntegerField(help_text="Captured from this project's holds (what its jobs cost).")


class BalanceSerializer(serializers.Serializer):
    """All amounts are integer micro-credits (1 credit = 1,000,000)."""

    org = serializers.IntegerField()
    project = serializers.IntegerField(allow_null=True)
    as_of = serializers.DateTimeField()
    totals = AmountsSerializer(
        help_text="Sums over `buckets`. For a project these are bucket totals: the org-wide buckets it "
        "shares are held and spent by the org's other projects too (see `project_usage`)."
    )
    paid = AmountsSerializer()
    promotional = AmountsSerializer()
    expiring = ExpiringSerializer()
    buckets = BucketBalanceSerializer(many=True)
    project_usage = ProjectUsageSerializer(
        allow_null=True,
        help_text="A project's balance only (null for an org): held and spent by this project's own holds, "
        "whichever buckets they drew on.",
    )


class BalanceQuerySerializer(StrictQuerySerializer):
    """The balance routes' one query parameter; any other is a 400 (a typo must not be ignored)."""

    as_of = AwareDateTimeField(
        required=False,
        help_text="Balance as it stood at this instant (ISO 8601 with offset), rebuilt from the journal. "
        "Not in the future; default now.",
    )

    def validate_as_of(self, value: datetime) -> datetime:
        now = ledger_now()
        if value > now:
            # The journal cannot know the future: answering with today's figures would pass them
            # off as a forecast.
            raise serializers.ValidationError(
                f"Must not be in the future (the ledger's clock reads {now.isoformat()})."
            )
        return value


class PostingSerializer(serializers.ModelSerializer):
    bucket = serializers.IntegerField(source="bucket_id", allow_null=True)

    class Meta:
        model = Posting
        fields = ["account", "bucket", "amount"]


class TransactionSerializer(serializers.ModelSerializer):
    hold = serializers.IntegerField(source="hold_id", allow_null=True)
    postings = PostingSerializer(many=True)

    class Meta:
        model = LedgerTransaction
        fields = ["id", "kind", "key", "hold", "created_at", "memo", "request_id", "postings"]


class TransactionQuerySerializer(StrictQuerySerializer):
    since = AwareDateTimeField(required=False)
    until = AwareDateTimeField(required=False)
    kind = serializers.ChoiceField(required=False, choices=TransactionKind.choices)
    page = QueryDigitsField(required=False, min_value=1, max_value=10**6)
    page_size = QueryDigitsField(required=False, min_value=1, max_value=200)

    def validate(self, attrs: dict) -> dict:
        # A reversed range is a mistake, not a question with an empty answer (QA: it was a 200 with
        # no rows). Equal bounds are an empty range of [since, until): allowed, as in the job list.
        since, until = attrs.get("since"), attrs.get("until")
        if since and until and until < since:
            raise serializers.ValidationError({"until": ["Must not be before since."]})
        return attrs


ISSUABLE_SOURCES = [(value, label) for value, label in BucketSource.choices if value != BucketSource.REFUND]


class CreditIssueSerializer(StrictSerializer):
    amount = StrictIntegerField(min_value=1, max_value=MAX_AMOUNT, help_text="Micro-credits.")
    kind = serializers.ChoiceField(choices=BucketKind.choices)
    source = serializers.ChoiceField(choices=ISSUABLE_SOURCES, help_text="A refund is issued by crediting "
                                     "a job (POST /jobs/{id}/refund).")
    reference = StrictCharField(min_length=1, max_length=128,
                                help_text="Finance reference (invoice, grant id); unique per org.")
    reason = StrictCharField(min_length=1, max_length=2000)

    def validate_reference(self, value: str) -> str:
        if problem := reference_problem(value):
            raise serializers.ValidationError(problem)
        return value
    effective_at = AwareDateTimeField(required=False, help_text="With its UTC offset; empty = now.")
    expires_at = AwareDateTimeField(required=False, help_text="With its UTC offset, in the future and after "
                                    "effective_at; empty = never.")
    project = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=2**53,
                                 help_text="Scope the credits to one project of the org; "
                                 "absent or null = the whole org.")
    gpu_types = serializers.ListField(child=StrictCharField(min_length=1, max_length=32),
                                      required=False, max_length=16, default=list)

    def validate(self, attrs: dict) -> dict:
        start, end = attrs.get("effective_at"), attrs.get("expires_at")
        if start and end and end <= start:
            raise serializers.ValidationError({"expires_at": ["Must be after effective_at."]})
        return attrs


class BucketSerializer(BucketBalanceSerializer):
    status = None  # type: ignore[assignment]
    spendable = None  # type: ignore[assignment]
    project = serializers.IntegerField(source="project_id", allow_null=True)
    reason = serializers.CharField()
    created_at = serializers.DateTimeField()
    already_issued = serializers.SerializerMethodField(
        help_text="True (with status 200) when this reference was issued before with the same terms: "
        "the existing bucket, nothing new issued.")

    def get_already_issued(self, bucket: Any) -> bool:
        return bool(getattr(bucket, "replayed", False))


class StatementQuerySerializer(StrictQuerySerializer):
    month = serializers.RegexField(MONTH_PATTERN, required=False, error_messages={"invalid": MONTH_MESSAGE},
                                   help_text="YYYY-MM (UTC); default: the month in progress.")
    format = serializers.ChoiceField(choices=["json", "csv"], required=False,
                                     help_text="csv: the statement as a spreadsheet (or Accept: text/csv).")


class StatementBalanceSerializer(serializers.Serializer):
    available = serializers.IntegerField()
    held = serializers.IntegerField()
    total = serializers.IntegerField()


class ConsumptionLineSerializer(serializers.Serializer):
    project = serializers.IntegerField(source="project_id", allow_null=True)
    project_slug = serializers.CharField(source="project")
    gpu_type = serializers.CharField(help_text="Empty for a capture that paid for no job attempt.")
    amount = serializers.IntegerField()
    gpu_hours = serializers.FloatField()


class StatementIssueSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    bucket = serializers.IntegerField(source="bucket_id")
    reference = serializers.CharField()
    kind = serializers.CharField()
    source = serializers.CharField()
    amount = serializers.IntegerField()


class StatementRefundSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    bucket = serializers.IntegerField(source="bucket_id", help_text="The bucket the credits went back to.")
    reference = serializers.CharField()
    job = serializers.IntegerField(source="job_id", allow_null=True)
    attempt = serializers.IntegerField(allow_null=True,
                                       help_text="The attempt's number; null: the whole job.")
    amount = serializers.IntegerField()
    reason = serializers.CharField()


class StatementSerializer(serializers.Serializer):
    org = serializers.IntegerField(source="org_id")
    month = serializers.CharField()
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField(help_text="The month's end, or now for the month in progress.")
    opening = StatementBalanceSerializer()
    issued = serializers.IntegerField()
    consumed = serializers.IntegerField()
    expired = serializers.IntegerField()
    voided = serializers.IntegerField()
    refunded = serializers.IntegerField(help_text="Credits given back for jobs' charges (refunds), apart "
                                        "from `issued`.")
    closing = StatementBalanceSerializer(
        help_text="= opening + issued + refunded - consumed - expired - voided")
    consumption = ConsumptionLineSerializer(many=True)
    issues = StatementIssueSerializer(many=True)
    refunds = StatementRefundSerializer(many=True)
    final = serializers.BooleanField(help_text=(
        "The month has ended and no transaction dated in it can still commit: the figures will not "
        "change. False for the month in progress and for a few seconds after a month ends."))
