"""The events a simulated put makes leave the scheduler's holder index in the
node's final state, with a disk tier below the host tier too."""
from __future__ import annotations

import random

import pytest

from speckv.loadgen.sim.kv_events import outcome_events
from speckv.loadgen.sim.kvnode import SimKVNode
from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.holder_index import HolderIndex


@pytest.mark.parametrize("seed", range(5))
def test_disk_events_leave_a_holder_index_in_the_three_tier_node_s_final_state(seed):
    """Random puts, promotions and host replicas on a small three-tier node:
    the index fed outcome_events agrees with the node on what it holds, what
    only its lower tiers hold and what only its disk holds."""
    rng = random.Random(seed)
    node = SimKVNode("n", pages=3, host_pages=3, disk_pages=4)
    index, n = HolderIndex(), NodeId("n")
    for step in range(300):
        chain = list(dict.fromkeys(rng.randrange(16) for _ in range(rng.randint(1, 5))))
        tier = Tier.HOST if rng.random() < 0.2 else Tier.DEVICE
        lease = step + rng.choice([0.5, 3.0]) if rng.random() < 0.3 else None
        promote = tier is Tier.DEVICE and lease is None and rng.random() < 0.3
        out = node.put(chain, float(step), lease, tier, promote=promote)
        for event in outcome_events(out, -1, "f", tier=tier):
            index.apply(n, event)
        everything = list(range(16))
        assert {h for h in everything if h in node} == {h for h in everything if index.holders(h)}
        for h in everything:
            assert index.disk_only_count(n, [h], 1) == node.disk_only([h], 1)
            assert index.host_only_count(n, [h], 1) == (h in node and not node.in_tier(h, Tier.DEVICE))
