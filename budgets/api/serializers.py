"""Budget input (strict) and output with the current period's consumption."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from budgets.models import Budget, BudgetPeriodKind, Enforcement
from config.api.serializers import (
    MAX_AMOUNT,
    AwareDateTimeField,
    StrictIntegerField,
    StrictSerializer,
)


class BudgetInputSerializer(StrictSerializer):
    period = serializers.ChoiceField(choices=BudgetPeriodKind.choices,
                                     help_text="month = calendar month (UTC); window = fixed window.")
    limit = StrictIntegerField(min_value=0, max_value=MAX_AMOUNT, help_text="Micro-credits per period.")
    enforcement = serializers.ChoiceField(choices=Enforcement.choices,
                                          help_text="hard rejects (402); soft accepts and alerts.")
    window_start = AwareDateTimeField(required=False)
    window_end = AwareDateTimeField(required=False)

    def validate(self, attrs: dict) -> dict:
        start, end = attrs.get("window_start"), attrs.get("window_end")
        if attrs["period"] == BudgetPeriodKind.WINDOW:
            if start is None or end is None:
                raise serializers.ValidationError({"window_end": ["A window needs start and end."]})
            if end <= start:
                raise serializers.ValidationError({"window_end": ["Must be after window_start."]})
        elif start is not None or end is not None:
            raise serializers.ValidationError({"window_start": ["Only for period=window."]})
        return attrs


class CurrentPeriodSerializer(serializers.Serializer):
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    held = serializers.IntegerField()
    spent = serializers.IntegerField()
    remaining = serializers.IntegerField()


class BudgetSerializer(serializers.ModelSerializer):
    org = serializers.IntegerField(source="org_id", read_only=True)
    project = serializers.IntegerField(source="project_id", read_only=True, allow_null=True)
    user = serializers.IntegerField(source="user_id", read_only=True, allow_null=True)
    current_period = serializers.SerializerMethodField()

    class Meta:
        model = Budget
        fields = ["id", "org", "project", "user", "level", "period", "window_start", "window_end",
                  "limit", "enforcement", "current_period"]
        read_only_fields = fields

    @extend_schema_field(CurrentPeriodSerializer(allow_null=True))
    def get_current_period(self, budget: Budget) -> dict | None:
        period = self.context.get("current_period")
        if period is None:
            return None
        return CurrentPeriodSerializer({
            "starts_at": period.starts_at, "ends_at": period.ends_at, "held": period.held,
            "spent": period.spent, "remaining": max(0, budget.limit - period.held - period.spent),
        }).data

