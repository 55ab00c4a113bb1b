"""Jobs API (`/api/v1/jobs`)."""
