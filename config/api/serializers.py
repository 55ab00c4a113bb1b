"""Strict serializer building blocks: unknown fields and loose types are 400s, never coerced."""

import re
from typing import Any

from django.utils.dateparse import parse_datetime
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail
from rest_framework.settings import api_settings

# Micro-credit amounts: positive, and far below BigInteger overflow even after summing. The ledger
# owns the bound (its services refuse more, whatever the caller); re-exported for the serializers.
from ledger.amounts import MAX_AMOUNT as MAX_AMOUNT


class StrictSerializer(serializers.Serializer):
    """Unknown keys in the body are a 400 (a typo must never be silently ignored)."""

    unknown_message = "Unknown field."

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: [self.unknown_message] for name in unknown})
        return super().to_internal_value(data)


class StrictQuerySerializer(StrictSerializer):
    """Query parameters: an unknown one is named as such, as on the routes that take none."""

    unknown_message = "Unknown query parameter."


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only: no strings, floats or booleans."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean only: no "yes", 1 or "true"."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    """A JSON string only (DRF would turn numbers into strings); no NUL characters."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data:
            raise serializers.ValidationError("NUL characters are not allowed.")
        return super().to_internal_value(data)


class StrictCharFieldSchema(OpenApiSerializerFieldExtension):
    """The schema says what StrictCharField enforces: no NUL (PostgreSQL text cannot hold it), and
    unless blank is allowed, something besides whitespace (DRF trims it, then refuses a blank
    string: `"\\n"` is 400 "may not be blank", which `minLength: 1` alone does not say), so
    clients and schema-driven fuzzers see them as rules, not surprise 400s."""

    target_class = StrictCharField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        if self.target.allow_blank or not self.target.trim_whitespace:
            return {**schema, "pattern": "^[^\\u0000]*$"}
        return {**schema, "pattern": "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"}


class StrictDateTimeField(serializers.DateTimeField):
    def to_internal_value(self, value: Any) -> Any:
        if not isinstance(value, str):
            self.fail("invalid", format="ISO 8601")
        return super().to_internal_value(value)


# A date and time, then a space where an offset's sign would be, then HH:MM or HHMM (or HH).
_PLUS_AS_SPACE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)? \d{2}(?::?\d{2})?$")


def _parses(value: str) -> bool:
    """Whether Django reads `value` as a date and time (the hint for an unencoded + is given only
    when encoding it would make the value valid: QA, `+99:00` got it)."""
    try:
        return parse_datetime(value) is not None
    except ValueError:
        return False


class AwareDateTimeField(StrictDateTimeField):
    """An ISO 8601 instant with its UTC offset (`Z` or `+02:00`). A naive time would be read in
    the server's zone, which the caller cannot see: asking for a balance "as of 03:40" must say
    which 03:40."""

    default_error_messages = {
        "naive": "Give the time with its UTC offset, e.g. 2026-11-22T03:40:00Z or +01:00.",
        "naive_query": "Give the time with its UTC offset, e.g. 2026-11-22T03:40:00Z or, with the + "
                       "encoded as in any query string, 2026-11-22T03:40:00%2B01:00.",
        "plus_as_space": "The + of the UTC offset arrived as a space: in a query string an unencoded + "
                         "means a space. Send it as %2B (e.g. 2026-11-22T03:40:00%2B01:00), or give the "
                         "time in UTC with Z.",
    }

    def to_internal_value(self, value: Any) -> Any:
        if isinstance(value, str):
            # A query parameter's "+02:00" the client did not URL-encode arrives as " 02:00" (QA: the
            # generic error listed "+HH:MM" among the formats, which the client had sent).
            in_query = isinstance(self.root, StrictQuerySerializer)
            if in_query and _PLUS_AS_SPACE.match(value) and _parses("+".join(value.rsplit(" ", 1))):
                self.fail("plus_as_space")
            try:
                parsed = parse_datetime(value)
            except ValueError:
                parsed = None  # out of range: DRF's own parse reports it as invalid
            if parsed is not None and parsed.tzinfo is None:
                self.fail("naive_query" if in_query else "naive")
        return super().to_internal_value(value)



class QueryDigitsField(serializers.IntegerField):
    """A whole number in a query string, in ASCII digits only: DRF's IntegerField takes "1.0",
    which the paginator then reads differently (review: `page=1.0` passed the check and was a 404,
    `page_size=1.0` passed and was ignored)."""

    def to_internal_value(self, data: Any) -> int:
        if not (isinstance(data, str) and data.isascii() and data.isdigit()):
            self.fail("invalid")
        return super().to_internal_value(data)


class PageQuerySerializer(StrictQuerySerializer):
    """Query of a paginated list (unknown query parameters are rejected)."""

    page = QueryDigitsField(required=False, min_value=1, max_value=10**6)
    page_size = QueryDigitsField(required=False, min_value=1, max_value=200)


def validated(serializer: serializers.Serializer, data: Any) -> Any:
    """`is_valid(raise_exception=True)` + `validated_data` on a serializer built once, shared.

    A serializer deep-copies its declared fields per instance (more CPU than validating a job
    body); `run_validation` on a shared instance keeps no per-call state. The error raised is the
    one `is_valid` raises (including its "No data provided" for a JSON `null` body).
    """
    try:
        return serializer.run_validation(data)
    except serializers.ValidationError as error:
        detail = error.detail
        if isinstance(detail, list) and len(detail) == 1 and getattr(detail[0], "code", None) == "null":
            detail = {api_settings.NON_FIELD_ERRORS_KEY: [ErrorDetail("No data provided", code="null")]}
        raise serializers.ValidationError(detail) from None


def query_of(request: Any, *, lists: tuple[str, ...] = ()) -> dict[str, str]:
    """The query parameters, each given once: a repeated one is a 400, not silently its last value.
    Those in `lists` take several values, repeated (`?state=queued&state=running`, OpenAPI's form
    style) or comma-separated (`?state=queued,running`): they are joined with commas."""
    params = request.query_params
    if repeated := sorted(name for name in params if name not in lists and len(params.getlist(name)) > 1):
        raise serializers.ValidationError({name: ["Give this parameter once."] for name in repeated})
    query = params.dict()
    for name in lists:
        if name in params:
            query[name] = ",".join(params.getlist(name))
    return query


def no_query(request: Any) -> None:
    """A route that takes no query parameters answers any with a 400, as the lists answer an
    unknown one: a typo (`?fields=`, `?org=`) must never be silently ignored."""
    if request.query_params:
        names = sorted(request.query_params)
        raise serializers.ValidationError({name: ["Unknown query parameter."] for name in names})
