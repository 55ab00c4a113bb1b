"""The hidden key a form is given when it is shown, so that submitting the same form twice (a
double click, a resent POST) writes once: the write is made idempotent by it (the finance admin's
void and refund actions, the portal's "make a key")."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django import forms

_SHAPE = re.compile(r"[0-9a-f]{32}")


def new_form_key() -> str:
    """A fresh key, made when the form is shown (never when it is submitted)."""
    return uuid.uuid4().hex


class FormKeyField(forms.CharField):
    """Takes only what `new_form_key` makes: the key is joined into other keys (a ledger key
    `void:admin:<key>:<bucket>`), so a crafted one (a colon, another bucket's number) must not be
    able to meet another write's."""

    default_error_messages = {
        "required": "This form is out of date or was altered: open it again.",
        "shape": "This form is out of date or was altered: open it again.",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(widget=forms.HiddenInput, max_length=32, **kwargs)

    def validate(self, value: Any) -> None:
        super().validate(value)
        if not _SHAPE.fullmatch(value):
            raise forms.ValidationError(self.error_messages["shape"], code="shape")
