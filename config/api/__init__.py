"""API plumbing shared by every app: problem details, idempotency, rate limits, pagination."""
