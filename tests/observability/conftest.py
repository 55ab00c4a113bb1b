"""Fixtures borrowed from the API tests (priced fleet, funded tenants, API-key clients) and the
metering tests (a node with a token, the real submission service)."""

from tests.api.conftest import _generous_rate_limits, api, fleet, job_body, tenant  # noqa: F401
from tests.metering.conftest import funded, submit, world  # noqa: F401
