"""An extension draws only on the buckets its hold's project may spend (mutation testing, session 18)."""

from __future__ import annotations

import pytest

from ledger.errors import InsufficientCredits
from ledger.services import extend_hold, place_hold
from tests.factories import ProjectFactory, fund
from tests.ledger.conftest import assert_journal_consistent

pytestmark = pytest.mark.django_db


def test_an_extension_never_draws_on_another_projects_credits(org) -> None:
    """Mutation testing, session 18: the project filter of `lock_eligible_buckets` (the Python path
    every `extend_hold` takes) flipped to `<>` went unnoticed: an extension of a P1 hold would
    have spent credits granted to P2 only, and refused P1's own."""
    p1, p2 = ProjectFactory(org=org), ProjectFactory(org=org)
    x = fund(org, 1000, project=p2)
    y = fund(org, 100, project=p1)
    hold = place_hold(org=org, amount=40, key="p1", project=p1)
    hold = extend_hold(hold=hold, amount=60, key="more")  # all Y has left
    assert {ln.bucket_id: ln.authorized for ln in hold.lines.all()} == {y.pk: 100}
    x.refresh_from_db()
    y.refresh_from_db()
    assert (x.available, x.held) == (1000, 0)
    assert (y.available, y.held) == (0, 100)
    with pytest.raises(InsufficientCredits):  # Y is empty; X is P2's
        extend_hold(hold=hold, amount=1, key="one-more")
    x.refresh_from_db()
    assert (x.available, x.held) == (1000, 0)
    assert_journal_consistent()
