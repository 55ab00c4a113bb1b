"""Finance forms for the admin: issuing credits and voiding with a reason (they call services)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from django import forms

from accounts.models import Organization, Project
from config.form_keys import FormKeyField
from ledger.amounts import MAX_AMOUNT
from ledger.models import MICRO, BucketKind, BucketSource

MAX_CREDITS = Decimal(MAX_AMOUNT) / MICRO


class PlainDecimalField(forms.DecimalField):
    """Digits with an optional fractional part, nothing else: `Decimal` also reads an exponent,
    so "1e3" issued 1,000 credits (QA) and a slip like "1e9" would issue a billion."""

    plain = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
    default_error_messages = {
        "plain": "Enter a plain decimal number, such as 1000 or 12.5: no exponent (1e3), sign or "
                 "separators.",
    }

    def to_python(self, value: Any) -> Decimal | None:
        if value not in self.empty_values and not self.plain.fullmatch(str(value).strip()):
            raise forms.ValidationError(self.error_messages["plain"], code="plain")
        return super().to_python(value)


def _gpu_type_choices() -> list[tuple[str, str]]:
    from scheduling.models import GpuType

    return [(name, name) for name in GpuType.objects.order_by("name").values_list("name", flat=True)]


class IssueCreditsForm(forms.Form):
    """Purchase, grant or promotion to an org (optionally one project), with a mandatory reason."""

    org = forms.ModelChoiceField(queryset=Organization.objects.order_by("slug"))
    project = forms.ModelChoiceField(
        queryset=Project.objects.select_related("org").order_by("org__slug", "slug"), required=False,
        help_text="Leave empty for credits usable by every project of the organization.",
    )
    source = forms.ChoiceField(choices=[c for c in BucketSource.choices if c[0] != BucketSource.REFUND])
    kind = forms.ChoiceField(choices=BucketKind.choices)
    credits = PlainDecimalField(
        # The API's cap (the ledger's MAX_AMOUNT), in credits; issue_credits refuses more anyway.
        min_value=Decimal("0.000001"), max_value=MAX_CREDITS, max_digits=18, decimal_places=6,
        help_text=f"In credits (1 credit = 1,000,000 micro-credits), at most {MAX_CREDITS:,}.",
    )
    reference = forms.CharField(max_length=128, help_text="Invoice or grant id; issuing is idempotent by it.")
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))
    effective_at = forms.DateTimeField(required=False, help_text="Empty = now.")
    expires_at = forms.DateTimeField(required=False, help_text="Empty = never.")
    gpu_types = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple,
        help_text="Empty = every GPU type.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["gpu_types"].choices = _gpu_type_choices()

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        project, org = data.get("project"), data.get("org")
        if project is not None and org is not None and project.org_id != org.pk:
            self.add_error("project", "This project belongs to another organization.")
        # An expiry in the past is refused by issue_credits (shown next to the field by the view):
        # only after it has looked for the reference, so the same grant sent again once its expiry
        # has passed still says it was issued already (QA).
        return data

    def micro_credits(self) -> int:
        return int(self.cleaned_data["credits"] * MICRO)


class VoidForm(forms.Form):
    """The reason (mandatory) for voiding the selected buckets' available credits (all of it, or a
    part of one bucket's), and whether to close them (offered ticked); `key` is made when the form
    is first shown, so submitting it twice voids once (QA: a double click voided a part twice)."""

    def __init__(self, *args: Any, buckets: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buckets = buckets

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("credits") is not None and self.buckets != 1:
            self.add_error("credits", "Select one bucket to void a part of it.")
        if data.get("credits") is not None and data.get("close"):
            # QA: the rest of the bucket expired at once, silently, with "close" left ticked.
            self.add_error("close", "A part is voided from a bucket that stays open: closing it would let "
                           "the rest expire now. Untick it, or leave the amount empty to void everything.")
        return data

    def micro_credits(self) -> int | None:
        credits = self.cleaned_data.get("credits")
        return None if credits is None else int(credits * MICRO)

    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))
    credits = PlainDecimalField(
        required=False, min_value=Decimal("0.000001"), max_value=MAX_CREDITS, max_digits=18, decimal_places=6,
        help_text="Empty = everything available. A part (in credits) is voided from one bucket at a time: "
        "to correct an over-issue, void the excess and leave the bucket open.",
    )
    close = forms.BooleanField(
        required=False, initial=True, label="Close the buckets",
        help_text="End their validity now: credits their running jobs give back later expire instead of "
        "becoming spendable again. Leave unticked to void only what is available now.",
    )
    key = FormKeyField()


class RefundForm(forms.Form):
    """Credit (refund) a job: the amount in credits, the attempt (empty: the job), a mandatory
    reason; `key` is made when the form is first shown, so submitting it twice refunds once."""

    credits = PlainDecimalField(
        min_value=Decimal("0.000001"), max_value=MAX_CREDITS, max_digits=18, decimal_places=6,
        help_text="At most what the job (or the attempt) was charged, less what was refunded for it.",
    )
    attempt = forms.IntegerField(required=False, min_value=1,
                                 help_text="An attempt's number; empty: the job.")
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))
    expires_at = forms.DateTimeField(required=False, help_text="Empty: the credits never expire.")
    key = FormKeyField()

    def micro_credits(self) -> int:
        return int(self.cleaned_data["credits"] * MICRO)
