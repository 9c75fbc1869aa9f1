"""SourceMerge in front of a real SchedulerCore: one node fed by its kvstore
and its engine, each source's snapshot, removal and reset touching only
what it alone holds, and the engine's blocks outliving re-registrations."""
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.ports import SchedulerSettings
from speckv.services.scheduler.source_merge import EventSource, SourceMerge

KV, ENGINE = EventSource.KVSTORE, EventSource.ENGINE
NODE = NodeId("n")


def ev(kind, hashes, tier=Tier.DEVICE, host=None):
    return IndexEvent(kind, list(hashes), has_parent=True, tier=tier, host_hashes=host)


def stored(hashes, tier=Tier.DEVICE):
    return ev(HolderEventKind.STORED, hashes, tier)


def removed(hashes, tier=Tier.DEVICE):
    return ev(HolderEventKind.REMOVED, hashes, tier)


@pytest.fixture
def env():
    core = SchedulerCore(SchedulerSettings(node_timeout_s=5.0), ManualClock(1000.0), get_profile("tiny"))
    core.register_node("n", "h:n", NodeSizes(1000, 1000), None)
    core.register_node("plain", "h:p", NodeSizes(1000), None)
    return core, SourceMerge(core, [NODE])


def held(core, node="n"):
    view = {r.view.node_id: r.view for r in core.cluster_state().nodes}[node]
    return view.num_blocks, view.device_blocks, view.host_blocks


def test_a_block_both_sources_hold_leaves_only_when_the_last_drops_it(env):
    core, merge = env
    gen = core.generation("n")
    assert merge.apply(NODE, ENGINE, None, [stored([1, 2, 3])])
    assert merge.apply(NODE, KV, gen, [stored([1, 2])])
    assert merge.apply(NODE, ENGINE, None, [removed([1, 2, 3])])
    assert held(core) == (2, 2, 0)  # 1 and 2 stay: the kvstore's device pool holds them
    assert merge.apply(NODE, KV, gen, [removed([1])])
    assert held(core) == (1, 1, 0)


def test_the_kvstores_snapshot_replaces_only_its_own_blocks(env):
    core, merge = env
    gen = core.generation("n")
    merge.apply(NODE, ENGINE, None, [stored([1, 2])])
    merge.apply(NODE, KV, gen, [stored([7, 8], Tier.HOST)])
    # A snapshot of the kvstore: 8 went, 9 came, device 2 too; the engine's 1 and 2 stay on the device.
    snapshot = ev(HolderEventKind.SNAPSHOT, [2], host=[9])
    assert merge.apply(NODE, KV, gen, [snapshot])
    assert held(core) == (3, 2, 1)
    assert merge.held(NODE, KV, Tier.HOST) == {9} and merge.held(NODE, KV, Tier.DEVICE) == {2}


def test_a_block_moving_between_the_kvstores_tiers_never_leaves_the_node(env):
    core, merge = env
    gen = core.generation("n")
    merge.apply(NODE, KV, gen, [stored([5])])
    assert merge.apply(NODE, KV, gen, [ev(HolderEventKind.SNAPSHOT, [], host=[5])])
    assert held(core) == (1, 0, 1)


def test_an_engine_reset_drops_only_what_the_engine_alone_held(env):
    core, merge = env
    gen = core.generation("n")
    merge.apply(NODE, ENGINE, None, [stored([1, 2, 3])])
    merge.apply(NODE, KV, gen, [stored([3])])
    assert merge.reset(NODE, ENGINE, None)
    assert held(core) == (1, 1, 0) and merge.held(NODE, ENGINE, Tier.DEVICE) == frozenset()


def test_a_stale_kvstore_generation_is_refused_and_changes_nothing(env):
    core, merge = env
    old = core.generation("n")
    merge.apply(NODE, KV, old, [stored([1])])
    core.register_node("n", "h:n", NodeSizes(1000, 1000), None)
    assert not merge.apply(NODE, KV, old, [stored([2])])
    assert not merge.reset(NODE, KV, old)
    assert held(core)[0] == 0
    merge.sync(NODE)  # the new registration's first call forgets the old stream's holdings
    assert merge.held(NODE, KV, Tier.DEVICE) == frozenset()


def test_the_engines_blocks_are_indexed_again_after_a_reregistration(env):
    core, merge = env
    merge.apply(NODE, ENGINE, None, [stored([1, 2])])
    merge.apply(NODE, KV, core.generation("n"), [stored([5], Tier.HOST)])
    core.register_node("n", "h:n", NodeSizes(1000, 1000), None)  # the kvstore restarted: the index forgot n
    assert held(core)[0] == 0
    merge.sync(NODE)  # the engine feed's next tick
    assert held(core) == (2, 2, 0)  # the engine's blocks are back; the kvstore's come from its new stream
    assert merge.held(NODE, KV, Tier.HOST) == frozenset()


def test_engine_events_before_the_node_registers_are_kept_for_it():
    core = SchedulerCore(SchedulerSettings(), ManualClock(1000.0), get_profile("tiny"))
    merge = SourceMerge(core, [NODE])
    assert merge.apply(NODE, ENGINE, None, [stored([1, 2]), removed([2])])
    assert not merge.apply(NODE, KV, 1, [stored([3])])  # no registration yet: a kvstore stream cannot be current
    core.register_node("n", "h:n", NodeSizes(1000), None)
    assert merge.apply(NODE, KV, core.generation("n"), [stored([3])])
    assert held(core) == (2, 2, 0)


def test_the_engine_keeps_its_holdings_while_the_node_is_down(env):
    core, merge = env
    gen = core.generation("n")
    core.node_lost("n", "its kvstore went away", gen)
    assert merge.apply(NODE, ENGINE, None, [stored([1])])  # the feed goes on: the node may come back
    assert not merge.apply(NODE, KV, gen, [stored([2])])  # the kvstore's stream of that registration ends
    core.register_node("n", "h:n", NodeSizes(1000, 1000), None)
    merge.sync(NODE)
    assert held(core) == (1, 1, 0)


def test_a_node_it_does_not_merge_is_not_its_concern(env):
    _, merge = env
    assert merge.merges(NODE) and not merge.merges(NodeId("plain"))
