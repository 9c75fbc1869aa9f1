"""The fallback placement (services/client/fallback.py): rendezvous affinity,
bounded load, least loaded; the client's view of node loads."""
from __future__ import annotations

import collections

import pytest

from speckv.services.client.fallback import (
    FallbackSettings,
    FallbackStrategy,
    KnownNodes,
    rendezvous_order,
    rendezvous_score,
)
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import NodeId

NODES = [f"n{i}" for i in range(4)]


def idle(nodes=NODES) -> dict[NodeId, int]:
    return {NodeId(n): 0 for n in nodes}


def test_the_score_is_the_stated_blake2b():
    import hashlib
    expected = int.from_bytes(hashlib.blake2b((7).to_bytes(8, "little") + b"n1", digest_size=8).digest(), "little")
    assert rendezvous_score(7, "n1") == expected


def test_one_prefix_always_lands_on_its_top_ranked_node_when_idle():
    strategy = FallbackStrategy()
    for first in range(50):
        top = rendezvous_order(first, NODES)[0]
        assert strategy.choose([first, 999], 100, idle()) == top
        assert strategy.choose([first], 5_000, idle()) == top  # the rest of the chain does not matter


def test_prefixes_spread_over_the_nodes():
    strategy = FallbackStrategy()
    counts = collections.Counter(strategy.choose([h], 10, idle()) for h in range(4_000))
    assert set(counts) == set(NODES)
    assert min(counts.values()) > 4_000 / len(NODES) * 0.8


def test_a_node_leaving_moves_only_the_prefixes_it_held():
    strategy = FallbackStrategy()
    before = {h: strategy.choose([h], 10, idle()) for h in range(2_000)}
    after = {h: strategy.choose([h], 10, idle(NODES[:-1])) for h in range(2_000)}
    moved = [h for h in before if before[h] != after[h]]
    assert moved and all(before[h] == NODES[-1] for h in moved)


def test_the_load_bound_holds_at_its_boundary():
    """bound = load_factor * (total + tokens) / n + slack; exactly at the bound stays, one token over spills."""
    strategy = FallbackStrategy(FallbackSettings(load_factor=1.0, slack_tokens=0))
    nodes = ["a", "b"]
    first = next(h for h in range(100) if rendezvous_order(h, nodes)[0] == "a")
    # a carries 100, b 0; a request of 100: bound = (100 + 100) / 2 = 100; a would carry 200 > 100: b
    assert strategy.choose([first], 100, {NodeId("a"): 100, NodeId("b"): 0}) == "b"
    # a and b carry 100 each; a request of 100: bound = 300 / 2 = 150, and either would carry 200:
    # no one fits, so the least loaded, ties by rank: a
    assert strategy.choose([first], 100, {NodeId("a"): 100, NodeId("b"): 100}) == "a"
    slack = FallbackStrategy(FallbackSettings(load_factor=1.0, slack_tokens=100))
    # bound = 200/2 + 100 = 200: a at exactly 200 stays
    assert slack.choose([first], 100, {NodeId("a"): 100, NodeId("b"): 0}) == "a"
    one_less = FallbackStrategy(FallbackSettings(load_factor=1.0, slack_tokens=99))
    assert one_less.choose([first], 100, {NodeId("a"): 100, NodeId("b"): 0}) == "b"


def test_a_hash_outside_uint64_is_taken_mod_2_64():
    assert rendezvous_score(-1, "n1") == rendezvous_score((1 << 64) - 1, "n1")
    assert rendezvous_score(1 << 64, "n1") == rendezvous_score(0, "n1")


def test_without_blocks_the_least_loaded_ties_by_node_id():
    strategy = FallbackStrategy()
    assert strategy.choose([], 10, {NodeId("b"): 5, NodeId("a"): 5, NodeId("c"): 9}) == "a"
    assert strategy.choose([], 10, {NodeId("b"): 4, NodeId("a"): 5}) == "b"


def test_no_candidate_is_none():
    assert FallbackStrategy().choose([1], 10, {}) is None


def test_known_nodes_track_open_routes_and_down_marks():
    known = KnownNodes({"a": "h:1", "b": "h:2"})
    known.opened("r1", "a", 100)
    known.opened("r2", "a", 50)
    known.opened("r3", "b", 10)
    assert known.snapshot() == {"a": 150, "b": 10}
    known.opened("r2", "b", 50)  # re-routed: its load moves
    assert known.snapshot() == {"a": 100, "b": 60}
    known.closed("r1")
    known.closed("r1")  # twice: once counts
    known.closed("unknown")
    assert known.snapshot() == {"a": 0, "b": 60}
    known.mark_down("b")
    assert known.snapshot() == {"a": 0}
    known.learn("c", "h:3")
    known.learn("b", "")  # named by the scheduler: up again, address kept
    assert known.snapshot() == {"a": 0, "b": 60, "c": 0} and known.address("b") == "h:2"


@pytest.mark.parametrize("kwargs", [{"load_factor": 0.99}, {"slack_tokens": -1}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(InvalidArgument):
        FallbackSettings(**kwargs)
