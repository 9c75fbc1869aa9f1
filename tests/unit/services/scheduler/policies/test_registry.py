import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import AlreadyExists, InvalidArgument
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.policies.none import NonePolicy
from speckv.services.scheduler.policies.registry import PolicyRegistry, default_registry
from speckv.services.scheduler.ports import SchedulerSettings
from speckv.services.scheduler.orders import OrderSpec, OrderState


def test_default_registry_has_the_six_policies():
    reg = default_registry()
    assert reg.available() == ["affinity", "none", "oracle", "predictive", "reactive-heat", "reactive-migrate"]
    policy = reg.create("none")
    assert policy.name == "none" and "no speculative" in policy.description


def test_unknown_policy_lists_available():
    with pytest.raises(InvalidArgument, match="available: affinity, none, oracle"):
        default_registry().create("psychic")


def test_register_twice_is_rejected():
    reg = PolicyRegistry()
    reg.register("none", NonePolicy)
    with pytest.raises(AlreadyExists):
        reg.register("none", NonePolicy)


class CopyOnce:
    """A test policy: replicates one chain a -> b on its first tick."""

    name = "copy-once"
    description = "test"

    def __init__(self):
        self.done = False
        self.prepared = 0

    def prepare(self, now):
        self.prepared += 1

    def plan(self, now, view):
        if self.done:
            return []
        self.done = True
        assert {n.node_id for n in view.live_nodes()} == {"a", "b"}
        return [OrderSpec(Family("f"), [1, 2], NodeId("a"), NodeId("b"), lease_ms=500),
                OrderSpec(Family("f"), [1], NodeId("a"), NodeId("ghost"), lease_ms=500)]  # dropped


def test_tick_submits_what_the_policy_plans():
    reg = default_registry()
    policy = CopyOnce()
    reg.register(policy.name, lambda: policy)
    clock = ManualClock(100.0)
    core = SchedulerCore(SchedulerSettings(), clock, get_profile("tiny"), registry=reg)
    for n in "ab":
        core.register_node(n, f"h:{ord(n)}", NodeSizes(64), None)
    assert core.tick() == []  # policy none
    core.set_policy("copy-once")
    issued = core.tick()
    assert [o.spec.target for o in issued] == ["b"] and issued[0].spec.policy == "copy-once"
    assert issued[0].spec.target_address == "h:98"
    assert policy.prepared == 1
    clock.advance(1.0)
    core.tick()  # lease of 500 ms passes
    assert core.order_counts()[OrderState.EXPIRED] == 1
