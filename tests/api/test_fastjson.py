"""The orjson parser/renderer produce exactly what the stdlib/DRF paths produce."""

import datetime
import json
import uuid
from decimal import Decimal

import pytest
from rest_framework.exceptions import ParseError
from rest_framework.renderers import JSONRenderer

from config.api import fastjson
from config.api.idempotency import _stored_form, canonical_json
from config.api.parsers import BoundedJSONParser

UTC = datetime.UTC

SAMPLES = [
    {"a": 1, "b": [1, 2, {"c": None}], "d": "é ü ✓ 😀", "e": True, "f": 1.5, "g": -0},
    {"when": datetime.datetime(2026, 11, 21, 7, 0, 1, 123456, tzinfo=UTC),
     "day": datetime.date(2026, 11, 21), "t": datetime.time(7, 1), "id": uuid.UUID(int=7),
     "money": Decimal("1.50"), "tuple": (1, 2)},
    {"sep": "line\u2028para\u2029end"},
    {"big": 2**70, "small": -(2**70)},
    {1: "non-string key"},
    [],
    "just a string",
]


@pytest.mark.parametrize("data", SAMPLES)
def test_renderer_is_byte_identical_to_drf(data):
    assert fastjson.FastJSONRenderer().render(data, "application/json") == JSONRenderer().render(
        data, "application/json"
    )


def test_renderer_honours_indent_and_none():
    data = {"a": [1, 2]}
    ours = fastjson.FastJSONRenderer().render(data, "application/json; indent=2")
    assert ours == JSONRenderer().render(data, "application/json; indent=2")
    assert fastjson.FastJSONRenderer().render(None) == b""


class _Request:
    def __init__(self, raw: bytes) -> None:
        self.META = {"CONTENT_LENGTH": str(len(raw))}


def _parse(raw: bytes):
    import io

    return BoundedJSONParser().parse(io.BytesIO(raw), parser_context={"request": _Request(raw)})


@pytest.mark.parametrize("raw", [
    b'{"a": 1, "b": [1.25, "x", null, true]}', b'{"a": 99999999999999999999999}',
    b'{"a": 18446744073709551616}', b'{"a":1,"a":2}', b'"\\ud800"', b"[1e400]", b"  {} ",
    '{"é": "ü"}'.encode(),
])
def test_parser_matches_json(raw):
    assert _parse(raw) == json.loads(raw.decode())
    assert type(_parse(raw)) is type(json.loads(raw.decode()))


@pytest.mark.parametrize("raw", [b"NaN", b'{"a": Infinity}', b"{", b"\xef\xbb\xbf{}", b"\xff", b""])
def test_parser_errors_are_the_stdlib_ones(raw):
    with pytest.raises(ParseError) as ours:
        _parse(raw)
    try:
        json.loads(raw.decode("utf-8"), parse_constant=lambda name: (_ for _ in ()).throw(
            ValueError(f"{name} is not valid JSON")))
    except (ValueError, UnicodeDecodeError) as error:
        assert str(ours.value.detail) == f"Malformed JSON: {error}"
    else:  # pragma: no cover
        pytest.fail("json accepted it")


@pytest.mark.parametrize("data", SAMPLES[:4])
def test_stored_form_matches_canonical_json(data):
    text, body = _stored_form(data)
    expected = canonical_json(data)
    assert json.loads(text) == json.loads(expected)
    assert body == json.loads(expected)
    assert list(body) == list(json.loads(expected)) if isinstance(body, dict) else True
