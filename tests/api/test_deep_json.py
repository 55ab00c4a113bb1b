"""Review: a body nested 100,000 deep (`[[[[…]]]]`, 200 kB) overflowed the JSON parser's recursion
and was a 500 from the agent API; every JSON endpoint answers it with a 400 problem."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from scheduling.models import Node, NodeState, Region
from scheduling.services.nodes import issue_node_token
from tests.api.conftest import client_for
from tests.api.test_jobs_submit import nothing_written

pytestmark = pytest.mark.django_db

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("path", ["/heartbeats", "/register", "/attempts/1/exit"])
def test_the_agent_api_answers_a_too_deep_body_with_a_400(fleet: dict[str, Any], path: str) -> None:
    node = Node.objects.create(name="deep", region=Region.objects.first(), gpu_type=fleet["H100"],
                               gpu_count=8, state=NodeState.READY)
    agent = Client(headers={"Authorization": f"Bearer {issue_node_token(node=node)}"},
                   raise_request_exception=False)
    response = agent.post(f"/api/v1/agent{path}", DEEP, content_type="application/json")
    assert response.status_code == 400, response.content[:200]
    assert response.json()["type"].endswith("invalid-json")


def test_the_jobs_api_answers_a_too_deep_body_with_a_400(tenant: Any) -> None:
    api = client_for(tenant.user)
    response = api.post("/api/v1/jobs", DEEP, content_type="application/json", HTTP_IDEMPOTENCY_KEY="deep")
    assert response.status_code == 400, response.content[:200]
    nothing_written()
