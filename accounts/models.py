"""Tenancy: regions, organizations (teams), projects, memberships, API keys, idempotency records."""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from simple_history.models import HistoricalRecords


class Region(models.Model):
    """A region where GPUs run and where an organization's wallet may live."""

    code = models.SlugField(max_length=32, unique=True)
    name = models.CharField(max_length=100)
    history = HistoricalRecords()

    def __str__(self) -> str:
        return self.code


MIN_HOLD_WINDOW_SECONDS = 60  # one metering charge interval (metering.conf METERING_CHARGE_INTERVAL_S)
HOLD_WINDOW_MESSAGE = (
    f"A hold window must be at least {MIN_HOLD_WINDOW_SECONDS} seconds (one metering charge interval); "
    "leave it empty for holds that cover the whole max wall time."
)
# The bounds the API (accounts.api.serializers) and the model (admin, forms, the CHECKs) share.
MAX_HOLD_WINDOW_SECONDS = 30 * 24 * 3600  # 2,592,000 s: 30 days
HOLD_WINDOW_MAX_MESSAGE = f"A hold window must be at most {MAX_HOLD_WINDOW_SECONDS:,} seconds (30 days)."
MIN_INFLIGHT_SUBMISSIONS = 1
MAX_INFLIGHT_SUBMISSIONS = 10_000
INFLIGHT_SUBMISSIONS_MESSAGE = (
    f"Max in-flight submissions must be {MIN_INFLIGHT_SUBMISSIONS} to {MAX_INFLIGHT_SUBMISSIONS:,} "
    "(0 would refuse every submission of the org with 429)."
)


class Organization(models.Model):
    """A tenant (team) that owns credits, projects and budgets."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64, unique=True)
    home_region = models.ForeignKey(Region, null=True, blank=True, on_delete=models.PROTECT)
    # Fair-share weight of this org among all orgs (Slurm "shares").
    fair_share_weight = models.PositiveIntegerField(default=1)
    # Policy: holds for long jobs cover at most this window and are renewed as the job runs; null:
    # no window (a hold covers the whole max wall time). At least one metering charge interval
    # (60 s): a shorter window was extended by less than a run uses between two charges, so the
    # hold fell behind and the usage past it went unfunded.
    # At most 30 days, as the API allows.
    hold_window_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[
            MinValueValidator(MIN_HOLD_WINDOW_SECONDS, HOLD_WINDOW_MESSAGE),
            MaxValueValidator(MAX_HOLD_WINDOW_SECONDS, HOLD_WINDOW_MAX_MESSAGE),
        ]
    )
    # Cap on concurrent in-flight submissions (rate-limit protection for the reservation path);
    # 1 to 10,000, as the API allows (QA: 0 saved in the admin, then every POST /jobs was 429).
    max_inflight_submissions = models.PositiveIntegerField(
        default=16, validators=[MinValueValidator(MIN_INFLIGHT_SUBMISSIONS, INFLIGHT_SUBMISSIONS_MESSAGE),
                                MaxValueValidator(MAX_INFLIGHT_SUBMISSIONS, INFLIGHT_SUBMISSIONS_MESSAGE)]
    )
    created_at = models.DateTimeField(auto_now_add=True)
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(fair_share_weight__gt=0),
                name="org_fair_share_weight_positive",
                violation_error_message="Fair-share weight must be positive.",
            ),
            models.CheckConstraint(
                condition=Q(hold_window_seconds__isnull=True)
                | Q(hold_window_seconds__gte=MIN_HOLD_WINDOW_SECONDS),
                name="org_hold_window_at_least_a_minute",
                violation_error_message=HOLD_WINDOW_MESSAGE,
            ),
            models.CheckConstraint(
                condition=Q(hold_window_seconds__isnull=True)
                | Q(hold_window_seconds__lte=MAX_HOLD_WINDOW_SECONDS),
                name="org_hold_window_at_most_30_days",
                violation_error_message=HOLD_WINDOW_MAX_MESSAGE,
            ),
            models.CheckConstraint(
                condition=Q(max_inflight_submissions__gte=MIN_INFLIGHT_SUBMISSIONS)
                & Q(max_inflight_submissions__lte=MAX_INFLIGHT_SUBMISSIONS),
                name="org_max_inflight_submissions_in_range",
                violation_error_message=INFLIGHT_SUBMISSIONS_MESSAGE,
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class OrgRole(models.TextChoices):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


class ProjectRole(models.TextChoices):
    """The roles a project membership may be given (the API, `add_project_member`, the admin): a
    viewer sees the project and its jobs, a member also submits, cancels, holds and releases them.
    Owner and admin are organization roles (`OrgMembership`): nothing reads them on a project
    membership, so they were refused there (QA: `"role": "owner"` was accepted and gave nothing).
    `Membership.role` keeps the `OrgRole` choices so rows given them before stay valid and readable;
    such a row acts as `member`."""

    MEMBER = "member"
    VIEWER = "viewer"


PROJECT_ROLE_MESSAGE = (
    "A project role is member or viewer; owner and admin are organization roles "
    "(an org membership, given in the admin)."
)


class OrgMembership(models.Model):
    """A user's role in an organization (owners/admins see and manage every project)."""

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="org_memberships"
    )
    role = models.CharField(max_length=16, choices=OrgRole.choices, default=OrgRole.MEMBER)
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "user"], name="org_membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.org} ({self.role})"


class Project(models.Model):
    """A project inside an organization; jobs, budgets and scoped credits attach to it."""

    org = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="projects")
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64)
    fair_share_weight = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "slug"], name="project_slug_unique_in_org"),
            # The target of composite foreign keys (project, org) from rows that carry both, so
            # the database, not only forms, keeps them in the same org (scheduling_quota).
            models.UniqueConstraint(fields=["id", "org"], name="project_id_org_unique"),
            models.CheckConstraint(
                condition=Q(fair_share_weight__gt=0),
                name="project_fair_share_weight_positive",
                violation_error_message="Fair-share weight must be positive.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.org.slug}/{self.slug}"


class Membership(models.Model):
    """A user's role in a project (member-in-project is the lowest budget level)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=OrgRole.choices, default=OrgRole.MEMBER)
    fair_share_weight = models.PositiveIntegerField(default=1)
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


API_KEY_STATES = ("active", "expired", "revoked")  # what a request with the key would meet


class ApiKey(models.Model):
    """A named, revocable, expirable API key; only its SHA-256 is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    # The first characters of the key, shown in the admin and used to find the row.
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Who made it: the user themselves (portal, API), an admin (the admin site); null for the system
    # (`manage.py create_api_key`) and for keys made before this was recorded. Only the keys a user
    # made themselves count toward their daily limit (API_KEYS_MAX_CREATED_PER_DAY).
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
    )

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class IdempotencyRecord(models.Model):
    """A mutating API request's key, fingerprint and stored response (DESIGN.md §7)."""

    class State(models.TextChoices):
        IN_FLIGHT = "in_flight"
        DONE = "done"

    principal = models.CharField(max_length=64)  # "user:<id>" — the caller the key belongs to
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)  # sha256(method, path, canonical body)
    state = models.CharField(max_length=16, choices=State.choices, default=State.IN_FLIGHT)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "key"], name="idempotency_key_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.principal}:{self.key}"
