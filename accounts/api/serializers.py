"""Organizations, projects and memberships: strict inputs, flat outputs."""

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts.models import (
    API_KEY_STATES,
    MAX_HOLD_WINDOW_SECONDS,
    MAX_INFLIGHT_SUBMISSIONS,
    MIN_HOLD_WINDOW_SECONDS,
    MIN_INFLIGHT_SUBMISSIONS,
    PROJECT_ROLE_MESSAGE,
    ApiKey,
    Membership,
    Organization,
    Project,
    ProjectRole,
    Region,
)
from accounts.selectors import org_people
from accounts.services import NO_SUCH_USER, key_state
from config.api.serializers import (
    AwareDateTimeField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
)
from config.text import has_control_characters

SLUG_RE = r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$"
# QA: DRF's "This value does not match the required pattern." did not say what a slug is.
SLUG_MESSAGE = "Lowercase letters, digits and inner dashes, 1-64 characters (e.g. ml-team)."


class SlugField(serializers.RegexField):
    """Lowercase letters, digits and inner dashes; a JSON string only."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(SLUG_RE, min_length=1, max_length=64, error_messages={"invalid": SLUG_MESSAGE},
                         **kwargs)

    def to_internal_value(self, data: object) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class OrganizationCreateSerializer(StrictSerializer):
    name = StrictCharField(min_length=1, max_length=200)
    slug = SlugField()
    home_region = StrictCharField(required=False, min_length=1, max_length=32,
                                  help_text="Region code of the org's wallet.")
    owner = StrictCharField(required=False, min_length=1, max_length=150,
                            help_text="Username made the org's owner.")
    # The model's bounds (accounts.models), so the admin and the API refuse the same values.
    hold_window_seconds = StrictIntegerField(required=False, min_value=MIN_HOLD_WINDOW_SECONDS,
                                             max_value=MAX_HOLD_WINDOW_SECONDS)
    max_inflight_submissions = StrictIntegerField(required=False, min_value=MIN_INFLIGHT_SUBMISSIONS,
                                                  max_value=MAX_INFLIGHT_SUBMISSIONS)

    # Looked up here, with the other fields' checks, so one answer names every bad field (QA: a bad
    # slug hid an unknown owner). Fields of the body, not the route's object: 400 naming them.
    def validate_home_region(self, code: str) -> Region:
        region = Region.objects.filter(code=code).first()
        if region is None:
            raise serializers.ValidationError("Unknown region.")
        return region

    def validate_owner(self, username: str) -> Any:
        owner = get_user_model().objects.filter(username=username, is_active=True).first()
        if owner is None:
            raise serializers.ValidationError("No such active user to make owner.")
        return owner


class OrganizationSerializer(serializers.ModelSerializer):
    home_region = serializers.SlugRelatedField(slug_field="code", read_only=True, allow_null=True)

    class Meta:
        model = Organization
        fields = ["id", "name", "slug", "home_region", "hold_window_seconds",
                  "max_inflight_submissions", "fair_share_weight", "created_at"]
        read_only_fields = fields


class ProjectCreateSerializer(StrictSerializer):
    name = StrictCharField(min_length=1, max_length=200)
    slug = SlugField()


class ProjectSerializer(serializers.ModelSerializer):
    org = serializers.IntegerField(source="org_id", read_only=True)

    class Meta:
        model = Project
        fields = ["id", "org", "name", "slug", "fair_share_weight", "created_at"]
        read_only_fields = fields


class MemberAddSerializer(StrictSerializer):
    """Needs `context["org_id"]`: the project's org, whose people are the only ones found."""

    user = StrictIntegerField(required=False, min_value=1, max_value=2**53,
                              help_text="User id of someone who already belongs to the project's org.")
    username = StrictCharField(required=False, min_length=1, max_length=150,
                               help_text="Username of someone who already belongs to the project's org.")
    role = serializers.ChoiceField(
        choices=ProjectRole.choices, default=ProjectRole.MEMBER,
        help_text="member (submits and manages jobs) or viewer (reads only).",
        error_messages={"invalid_choice": f'"{{input}}" is not a project role. {PROJECT_ROLE_MESSAGE}'},
    )

    def validate(self, attrs: dict) -> dict:
        if ("user" in attrs) == ("username" in attrs):
            raise serializers.ValidationError({"user": ["Give exactly one of user or username."]})
        # A user outside the org is answered like an unknown one, so the route reveals no
        # usernames or ids of other orgs (QA).
        users = org_people(self.context["org_id"])
        found = (users.filter(pk=attrs["user"]) if "user" in attrs
                 else users.filter(username=attrs["username"])).first()
        if found is None:
            raise serializers.ValidationError({"user": [NO_SUCH_USER]})
        attrs["user_obj"] = found
        return attrs


class ProjectMemberSerializer(serializers.ModelSerializer):
    """A project membership as listed: the user's id (for the per-member budget route and the
    job list's `user` filter), username and project role."""

    project = serializers.IntegerField(source="project_id", read_only=True)
    user = serializers.IntegerField(source="user_id", read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)
    role = serializers.CharField(
        read_only=True, help_text="member or viewer (owner/admin only on memberships given them "
                                  "before they were refused; they act as member).")

    class Meta:
        model = Membership
        fields = ["id", "project", "user", "username", "role"]
        read_only_fields = fields


class MembershipSerializer(ProjectMemberSerializer):
    unchanged = serializers.SerializerMethodField(
        help_text="True (with status 200) when the user already had this role: nothing changed.")

    class Meta(ProjectMemberSerializer.Meta):
        fields = [*ProjectMemberSerializer.Meta.fields, "unchanged"]
        read_only_fields = fields

    def get_unchanged(self, membership: Membership) -> bool:
        return bool(getattr(membership, "unchanged", False))


class ApiKeyCreateSerializer(StrictSerializer):
    name = StrictCharField(min_length=1, max_length=100,
                           help_text="What the key is for, e.g. `laptop`; no control or format characters "
                           "(Unicode Cc, Cf, Zl, Zp), which are a 400.")
    expires_at = AwareDateTimeField(required=False, allow_null=True,
                                    help_text="With its UTC offset, in the future; empty: never expires.")

    def validate_name(self, value: str) -> str:
        if has_control_characters(value):
            raise serializers.ValidationError("Control characters are not allowed.")
        return value

    def validate_expires_at(self, value: datetime | None) -> datetime | None:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("The expiry must be in the future.")
        return value


class ApiKeySerializer(serializers.ModelSerializer):
    state = serializers.SerializerMethodField(help_text="`active`, `expired` or `revoked`.")

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "state", "created_at", "expires_at", "revoked_at", "last_used_at"]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=API_KEY_STATES))
    def get_state(self, key: ApiKey) -> str:
        return key_state(key)


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(
        allow_null=True,
        help_text="The secret, in this first answer only (it is stored hashed); null in a replay.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]
        read_only_fields = fields
