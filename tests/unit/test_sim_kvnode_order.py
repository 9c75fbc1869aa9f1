"""The simulated kvstore evicts as the live one does: a chain's tail before its head."""
from __future__ import annotations

import pytest

from speckv.loadgen.sim.kvnode import SimKVNode


@pytest.mark.parametrize("reuse", ["lookup", "put"])
def test_a_chain_loses_its_tail_before_its_head(reuse):
    node = SimKVNode("n", pages=4)
    node.put([1, 2, 3], now=0.0)
    node.put([9], now=1.0)
    if reuse == "lookup":
        assert node.lookup([1, 2, 3]) == 3
    else:
        assert node.put([1, 2, 3], now=2.0).stored == []
    out = node.put([10, 11, 12], now=3.0)
    assert out.evicted == [9, 3, 2]
    assert node.lookup([1, 2, 3]) == 1


def test_a_replica_goes_in_tail_first_and_reports_its_blocks_head_first():
    node = SimKVNode("n", pages=3)
    out = node.put([5, 6, 7], now=0.0, lease_deadline=10.0)
    assert out.stored == [5, 6, 7]
    lapsed = node.put([8], now=11.0)  # lapsed replicas go first, earliest deadline, then tail first
    assert lapsed.evicted == [7]


def test_a_put_never_evicts_resident_blocks_of_its_own_chain():
    node = SimKVNode("n", pages=3)
    node.put([1, 2], now=0.0)
    node.put([7], now=1.0)  # now 1, 2 are the least recently used
    out = node.put([1, 2, 3], now=2.0)  # 3 needs a page: 7 goes, not 1 or 2
    assert out.evicted == [7] and node.lookup([1, 2, 3]) == 3


def test_a_chain_longer_than_the_pool_keeps_what_fits():
    node = SimKVNode("n", pages=2)
    out = node.put([1, 2, 3], now=0.0)
    assert out.stored == [1, 2, 3] and out.evicted == [1]
    assert len(node) == 2
