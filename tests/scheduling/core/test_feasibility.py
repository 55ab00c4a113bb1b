"""`why_never_fits` agrees with the placement the scheduler would make on the idle fleet, and
names what to change; `why_over_quota` names the binding quota."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core.feasibility import idle_fleet, why_never_fits, why_over_quota
from scheduling.core.model import Node, Quotas

TYPES = ("H100", "A100")
REGIONS = ("eu", "us")


@st.composite
def fleets(draw: st.DrawFn) -> list[Node]:
    n = draw(st.integers(0, 12))
    return [
        Node(
            i, draw(st.sampled_from(TYPES)), draw(st.sampled_from((2, 4, 8))), frozenset(),
            region=draw(st.sampled_from(REGIONS)), ib_group=draw(st.sampled_from(("", "a", "b"))),
            state=draw(st.sampled_from(("ready", "down", "draining"))),
        )
        for i in range(n)
    ]


@settings(max_examples=300, deadline=None)
@given(
    nodes=fleets(),
    gpu_type=st.sampled_from(TYPES),
    g=st.integers(1, 40),
    regions=st.sampled_from(((), ("eu",), ("us",), ("eu", "us"))),
)
def test_never_fits_exactly_when_the_idle_fleet_has_no_placement(
    nodes: list[Node], gpu_type: str, g: int, regions: tuple[str, ...]
) -> None:
    fleet = idle_fleet(nodes)
    placement = fleet.find(gpu_type, g, regions)
    never = why_never_fits(fleet, gpu_type, g, regions)
    assert (never is None) == (placement is not None)


def test_reasons_name_what_to_change() -> None:
    nodes = [Node(1, "H100", 8, frozenset(), region="eu", ib_group="a", state="down"),
             Node(2, "H100", 8, frozenset(), region="eu", ib_group="a"),
             Node(3, "H100", 4, frozenset(), region="us")]
    fleet = idle_fleet(nodes)  # a down node may come back: it counts
    assert why_never_fits(fleet, "H100", 16, ()) is None
    never = why_never_fits(fleet, "H100", 17, ())
    assert never is not None and never.cause == "size"
    assert never.message == "17 GPUs need H100 nodes of one IB group and the largest group has 16 GPUs"
    never = why_never_fits(fleet, "H100", 6, ("us",))
    assert never is not None and (never.cause, never.message) == (
        "size", "6 GPUs must fit one H100 node and the largest in us has 4")
    never = why_never_fits(fleet, "A100", 1, ())
    assert never is not None and (never.cause, never.message) == ("type", "there are no A100 nodes")
    never = why_never_fits(idle_fleet(nodes[:2]), "H100", 1, ("us",))
    assert never is not None and (never.cause, never.message) == ("regions", "there are no H100 nodes in us")


def test_over_quota_names_the_binding_level() -> None:
    quotas = Quotas(org={(1, "H100"): 8}, project={(10, "H100"): 4})
    assert why_over_quota(quotas, 1, 10, "H100", 4) is None
    never = why_over_quota(quotas, 1, 10, "H100", 5)
    assert never is not None and never.message == "the project's concurrent-GPU quota on H100 is 4"
    never = why_over_quota(quotas, 1, 11, "H100", 9)
    assert never is not None and never.message == "the organization's concurrent-GPU quota on H100 is 8"
    assert why_over_quota(quotas, 2, 20, "H100", 100) is None
