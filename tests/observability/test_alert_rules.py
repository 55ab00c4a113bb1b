"""docs/prometheus/alerts.yml parses, and every metric it (or docs/observability.md) names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.test import Client
from prometheus_client import REGISTRY

ALERTS = Path(settings.BASE_DIR) / "docs" / "prometheus" / "alerts.yml"
GUIDE = Path(settings.BASE_DIR) / "docs" / "observability.md"
METRIC = re.compile(r"\bgpubank_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "summary": ("", "_count", "_sum", "_created")}


@pytest.fixture
def exposed(db: None) -> set[str]:
    """Every series name the registry can expose once the app has booted and served a request."""
    assert Client().get("/healthz").status_code == 200  # middleware, URLconf and views loaded
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)  # a histogram's own name, as the guide's table writes it
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def rules() -> list[dict]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_alert_rules_are_well_formed() -> None:
    found = rules()
    assert len(found) >= 8
    assert len({rule["alert"] for rule in found}) == len(found)
    for rule in found:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"page", "ticket", "info"}
        assert rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]


def test_every_metric_in_the_rules_exists(exposed: set[str]) -> None:
    referenced = {name for rule in rules() for name in METRIC.findall(rule["expr"])}
    assert referenced, "the rules reference no gpubank metric"
    assert referenced - exposed == set()


def test_every_metric_in_the_guide_exists(exposed: set[str]) -> None:
    referenced = set(METRIC.findall(GUIDE.read_text()))
    assert len(referenced) >= 10
    assert referenced - exposed == set()
