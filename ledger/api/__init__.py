"""Balance, journal and credit-issuance endpoints (`/api/v1/orgs/{id}/...`, `/projects/{id}/balance`)."""
