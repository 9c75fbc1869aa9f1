"""restore.py: a core resumed from a SavedState (a restart) or taking a
leader's state over (a replica elected) gets the saved committed copies by
transport, replacing whatever it counted, and keeps counting from them; a
replica that steps down forgets its figures as it forgets its orders."""
from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import FailedPrecondition
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.orders import OrderSpec, OrderState
from speckv.services.scheduler.ports import SavedNode, SavedState, SchedulerSettings
from speckv.services.scheduler.replication.transports import Carried

MIB = 1 << 20
SAVED = [Carried("a", "b", "", 1, MIB), Carried("a", "b", "tcp", 3, 12 * MIB), Carried("b", "a", "shm", 2, MIB)]


def saved_state(**kw) -> SavedState:
    geometry = get_profile("tiny").geometry
    nodes = [SavedNode(NodeId(n), f"h:{n}", NodeSizes(1000), geometry) for n in "ab"]
    return SavedState(nodes=nodes, transports=list(SAVED), **kw)


def core() -> SchedulerCore:
    return SchedulerCore(SchedulerSettings(), ManualClock(100.0), get_profile("tiny"))


def test_a_restored_core_reports_the_saved_copies_and_counts_on_from_them():
    resumed = core()
    resumed.restore(saved_state())
    assert resumed.cluster_state().transports == tuple(SAVED)
    for n in "ab":
        resumed.register_node(n, f"h:{n}", NodeSizes(1000), None)
    order = resumed.submit_order(OrderSpec(Family("f"), [1], NodeId("a"), NodeId("b"), 5000))
    resumed.report_order(order.order_id, OrderState.COMMITTED, "", 4 * MIB, 1, "tcp")
    assert resumed.cluster_state().transports == (SAVED[0], Carried("a", "b", "tcp", 4, 16 * MIB), SAVED[2])


def test_restore_needs_an_empty_core_and_then_changes_no_figure():
    busy = core()
    for n in "ab":
        busy.register_node(n, f"h:{n}", NodeSizes(1000), None)
    with pytest.raises(FailedPrecondition):
        busy.restore(saved_state())
    assert busy.cluster_state().transports == ()


def test_a_replica_taking_over_replaces_its_figures_and_one_stepping_down_forgets_them():
    replica = core()
    for n in "ab":
        replica.register_node(n, f"h:{n}", NodeSizes(1000), None)
    order = replica.submit_order(OrderSpec(Family("f"), [1], NodeId("b"), NodeId("a"), 5000))
    replica.report_order(order.order_id, OrderState.COMMITTED, "", MIB, 1, "grpc")  # held from an earlier term
    replica.take_over(saved_state())
    assert replica.cluster_state().transports == tuple(SAVED)
    replica.step_down()
    assert replica.cluster_state().transports == ()
