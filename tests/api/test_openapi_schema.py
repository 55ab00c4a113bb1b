"""/api/schema/ states the same job-submission limits as docs/api.md and the serializer."""

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from scheduling.api.serializers import MAX_GPU_TYPES

pytestmark = pytest.mark.django_db
API_DOC = Path(settings.BASE_DIR) / "docs" / "api.md"


def test_gpu_types_limit_is_the_serializers_whatever_the_fleet(api: APIClient, fleet: dict[str, Any]) -> None:
    """The fleet has 3 GPU types; the stated limit is still 8 (the fleet bounds a valid list
    through `uniqueItems` + the enum, not through `maxItems`)."""
    response = api.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    gpu_types = response.json()["components"]["schemas"]["JobSubmitRequest"]["properties"]["gpu_types"]
    assert len(fleet) == 3 and gpu_types["items"]["enum"] == sorted(fleet)
    assert gpu_types["uniqueItems"] is True
    assert (gpu_types["minItems"], gpu_types["maxItems"]) == (1, MAX_GPU_TYPES) == (1, 8)
    assert f"`gpu_types` (1\u2013{MAX_GPU_TYPES} distinct names" in API_DOC.read_text()
