"""An order fits its target's tiers or is refused, and gets its defaults:
the target's address, the chain's family, "manual", the tier it lands in."""
import pytest

from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import NodeId, default_family
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.cluster import Cluster, Node
from speckv.services.scheduler.replication.admission import admitted
from speckv.services.scheduler.orders import ActionKind, OrderSpec

GEO = KVGeometry(2, 2, 8, "float16", 4)


def node(host_pages: int) -> Node:
    registered, _ = Cluster(5.0).register(NodeId("t"), "h:1", NodeSizes(100, host_pages), GEO, now=0.0)
    return registered


def spec(action=ActionKind.REPLICATE, tier=None) -> OrderSpec:
    return OrderSpec("", [1, 2], NodeId("s"), NodeId("t"), 1000, tier=tier, action=action)


@pytest.mark.parametrize("host, action, tier, landed", [
    (0, ActionKind.REPLICATE, None, Tier.DEVICE), (50, ActionKind.REPLICATE, None, Tier.HOST),
    (50, ActionKind.REPLICATE, Tier.DEVICE, Tier.DEVICE), (50, ActionKind.PREFETCH, None, Tier.DEVICE),
    (50, ActionKind.RETAIN, None, Tier.HOST), (0, ActionKind.RETAIN, Tier.DEVICE, Tier.DEVICE),
])
def test_an_order_lands_in_its_tier_with_its_defaults(host, action, tier, landed):
    out = admitted(spec(action, tier), node(host))
    assert (out.tier, out.target_address, out.family, out.policy) == (landed, "h:1", default_family([1, 2]), "manual")


@pytest.mark.parametrize("host, action, tier, error", [
    (0, ActionKind.REPLICATE, Tier.HOST, FailedPrecondition), (50, ActionKind.PREFETCH, Tier.HOST, InvalidArgument),
    (50, ActionKind.RETAIN, Tier.DEVICE, InvalidArgument), (0, ActionKind.PREFETCH, None, FailedPrecondition),
])
def test_an_order_that_does_not_fit_its_target_is_refused(host, action, tier, error):
    with pytest.raises(error):
        admitted(spec(action, tier), node(host))
