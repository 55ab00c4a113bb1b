"""The credit ledger: buckets (lots), the double-entry journal, and two-phase holds.

Amounts are integers in micro-credits (1 credit = 1_000_000). Bucket columns are a cache
of the postings; `manage.py verify_ledger` rebuilds them from the journal.
"""

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from accounts.models import Organization, Project

MICRO = 1_000_000


class BucketKind(models.TextChoices):
    PAID = "paid"
    PROMOTIONAL = "promotional"


class BucketSource(models.TextChoices):
    PURCHASE = "purchase"
    GRANT = "grant"
    PROMOTION = "promotion"
    # Credits given back for what a job was charged (`scheduling.services.refunds.refund_job`);
    # never issued through `issue_credits`.
    REFUND = "refund"


class Bucket(models.Model):
    """A lot of credits with its own kind, source, validity window and applicability."""

    # db_index=False: (org, reference) and (org, expires_at) indexes lead with org already.
    org = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="buckets", db_index=False)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.PROTECT, related_name="buckets"
    )
    kind = models.CharField(max_length=16, choices=BucketKind.choices)
    source = models.CharField(max_length=16, choices=BucketSource.choices)
    # Empty list = every GPU type; otherwise only these GPU type names may spend it.
    gpu_types = models.JSONField(default=list, blank=True)
    effective_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # Finance closed it (`void_credits(close=True)`): `expires_at` moved to that instant, and the
    # expiry it had before is kept, so a balance as of an earlier time shows the bucket as it was.
    closed_at = models.DateTimeField(null=True, blank=True)
    expires_at_before_close = models.DateTimeField(null=True, blank=True)
    granted = models.BigIntegerField()
    available = models.BigIntegerField()
    held = models.BigIntegerField(default=0)
    spent = models.BigIntegerField(default=0)
    expired = models.BigIntegerField(default=0)
    voided = models.BigIntegerField(default=0)
    # Finance's reference (invoice, grant id): issuance is idempotent by (org, reference).
    reference = models.CharField(max_length=128)
    reason = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Not a column: `issue_credits` sets it on the bucket it returns for a reference that was
    # already issued with the same parameters (nothing new written), so callers can say so.
    replayed: bool = False

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "reference"], name="bucket_reference_unique"),
            models.CheckConstraint(condition=Q(granted__gt=0), name="bucket_granted_positive"),
            models.CheckConstraint(
                condition=Q(available__gte=0, held__gte=0, spent__gte=0, expired__gte=0, voided__gte=0),
                name="bucket_columns_non_negative",
                violation_error_message="A bucket balance can never be negative.",
            ),
            models.CheckConstraint(
                condition=Q(
                    granted=F("available") + F("held") + F("spent") + F("expired") + F("voided")
                ),
                name="bucket_conservation",
                violation_error_message="available + held + spent + expired + voided must equal granted.",
            ),
            models.CheckConstraint(
                condition=Q(expires_at__isnull=True) | Q(expires_at__gt=F("effective_at")),
                name="bucket_expiry_after_effective",
            ),
        ]
        indexes = [models.Index(fields=["org", "expires_at"], name="bucket_org_expiry_idx")]
        permissions = [
            ("issue_credits", "Can issue credits (purchase, grant, promotion)"),
            ("void_credits", "Can void available credits"),
        ]

    def __str__(self) -> str:
        return f"bucket {self.pk} ({self.kind}/{self.source}) of {self.org_id}"


class TransactionKind(models.TextChoices):
    ISSUE = "issue"
    VOID = "void"
    HOLD = "hold"
    EXTEND = "extend"
    CAPTURE = "capture"
    RELEASE = "release"
    EXPIRE = "expire"
    REFUND = "refund"  # refund -> bucket.available: credits given back for a job's charges


class LedgerTransaction(models.Model):
    """One balanced movement of credits; its postings sum to zero."""

    # db_index=False: the unique (org, key) index leads with org (one index entry less per row).
    org = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="transactions", db_index=False
    )
    kind = models.CharField(max_length=16, choices=TransactionKind.choices)
    # Natural idempotency key of the operation, e.g. "hold:<key>", "expire:<bucket>:<expired before>".
    key = models.CharField(max_length=200)
    hold = models.ForeignKey(
        "Hold", null=True, blank=True, on_delete=models.PROTECT, related_name="transactions"
    )
    created_at = models.DateTimeField(db_index=True)  # database clock
    memo = models.TextField(blank=True, default="")
    # Total moved (sum of the positive postings); what a retry with the same key must match.
    amount = models.BigIntegerField(default=0)
    # The operation's parameters, compared on a retry with the same key (idempotency).
    params = models.JSONField(default=dict, blank=True)
    request_id = models.CharField(max_length=64, blank=True, default="")
    # Not a column: `void_credits` sets it on the transaction it returns for a key already used
    # with the same parameters (nothing new written), so callers can say so instead of "voided".
    replayed: bool = False

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "key"], name="ledger_txn_key_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk}"


class Account(models.TextChoices):
    BUCKET_AVAILABLE = "bucket_available"
    BUCKET_HELD = "bucket_held"
    ISSUANCE = "issuance"
    CONSUMPTION = "consumption"
    EXPIRY = "expiry"
    VOID = "void"
    REFUND = "refund"  # what finance gave back for jobs' charges (a contra account of consumption)


BUCKET_ACCOUNTS = (Account.BUCKET_AVAILABLE, Account.BUCKET_HELD)


class Posting(models.Model):
    """One leg of a transaction: a signed amount on one account (per-bucket or system)."""

    transaction = models.ForeignKey(
        LedgerTransaction, on_delete=models.PROTECT, related_name="postings"
    )
    org_id = models.BigIntegerField(db_index=True)  # distribution column (DESIGN.md §14)
    account = models.CharField(max_length=24, choices=Account.choices)
    bucket = models.ForeignKey(
        Bucket, null=True, blank=True, on_delete=models.PROTECT, related_name="postings"
    )
    amount = models.BigIntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(amount=0), name="posting_amount_nonzero"),
            models.CheckConstraint(
                condition=(
                    Q(account__in=BUCKET_ACCOUNTS, bucket__isnull=False)
                    | (~Q(account__in=BUCKET_ACCOUNTS) & Q(bucket__isnull=True))
                ),
                name="posting_bucket_iff_bucket_account",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.account} {self.amount:+d}"


class HoldState(models.TextChoices):
    ACTIVE = "active"
    SETTLED = "settled"
    VOIDED = "voided"


class Hold(models.Model):
    """A two-phase authorization against buckets; settled exactly once."""

    # db_index=False: the unique (org, key) index leads with org (one index entry less per row).
    org = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="holds", db_index=False)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.PROTECT, related_name="holds"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    key = models.CharField(max_length=200)  # caller's idempotency key for placing it
    # What the hold is for, e.g. "job:12/attempt:1"; the ledger does not know about jobs.
    reference = models.CharField(max_length=200, blank=True, default="")
    # GPU types this hold may be spent on (applicability filter for its buckets).
    gpu_types = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=16, choices=HoldState.choices, default=HoldState.ACTIVE)
    authorized = models.BigIntegerField(default=0)  # total ever held (place + extends)
    captured = models.BigIntegerField(default=0)
    released = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "key"], name="hold_key_unique"),
            models.CheckConstraint(
                condition=Q(authorized__gte=0, captured__gte=0, released__gte=0)
                & Q(authorized__gte=F("captured") + F("released")),
                name="hold_amounts_consistent",
                violation_error_message="A hold can never capture or release more than it holds.",
            ),
            models.CheckConstraint(
                condition=Q(state="active")
                | Q(authorized=F("captured") + F("released"), settled_at__isnull=False),
                name="hold_settled_is_closed",
                violation_error_message="A settled hold has nothing left held.",
            ),
        ]
        indexes = [models.Index(fields=["state", "created_at"], name="hold_state_idx")]

    def __str__(self) -> str:
        return f"hold {self.pk} ({self.state})"

    @property
    def remaining(self) -> int:
        return self.authorized - self.captured - self.released


class HoldLine(models.Model):
    """The part of a hold drawn from one bucket, so releases go back where they came from."""

    # db_index=False: the unique (hold, bucket) index leads with hold.
    hold = models.ForeignKey(Hold, on_delete=models.PROTECT, related_name="lines", db_index=False)
    bucket = models.ForeignKey(Bucket, on_delete=models.PROTECT, related_name="hold_lines")
    authorized = models.BigIntegerField(default=0)
    captured = models.BigIntegerField(default=0)
    released = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["hold", "bucket"], name="hold_line_unique"),
            models.CheckConstraint(
                condition=Q(authorized__gte=0, captured__gte=0, released__gte=0)
                & Q(authorized__gte=F("captured") + F("released")),
                name="hold_line_amounts_consistent",
            ),
        ]

    def __str__(self) -> str:
        return f"hold {self.hold_id} / bucket {self.bucket_id}"
