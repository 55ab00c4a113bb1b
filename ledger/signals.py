"""Signals other apps may act on; the ledger does not know who listens."""

from django.dispatch import Signal

# An organization may now fund more than before (credits issued, a budget raised or redefined).
# Sent inside the writer's transaction with `org_id`; receivers act after it commits.
funds_changed = Signal()
