"""Committed copies counted per (source, target, transport), from the
sources' reports, including a report that arrives after the target's KV
events already committed the order."""
from __future__ import annotations

import pytest

from speckv.services.common.errors import InvalidArgument, Unavailable
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.holder_index import HolderEventKind
from speckv.services.scheduler.orders import OrderSpec, OrderState
from speckv.services.scheduler.replication.transports import Carried, TransportTally, check_transport
from tests.support.scheduler_scenarios import make_core, store

MIB = 1 << 20


def test_the_tally_counts_orders_and_bytes_per_pair_and_transport():
    tally = TransportTally()
    tally.add("a", "b", "tcp", 4 * MIB)
    tally.add("a", "b", "tcp", 2 * MIB)
    tally.add("a", "b", "shm", MIB)
    tally.add("b", "a", "nixl", MIB)
    assert tally.rows() == [Carried("a", "b", "shm", 1, MIB), Carried("a", "b", "tcp", 2, 6 * MIB),
                            Carried("b", "a", "nixl", 1, MIB)]


def test_a_late_label_moves_an_unlabelled_copy():
    tally = TransportTally()
    tally.add("a", "b", "", MIB)
    tally.add("a", "b", "", MIB)
    tally.relabel("a", "b", "tcp", MIB)
    assert tally.rows() == [Carried("a", "b", "", 1, MIB), Carried("a", "b", "tcp", 1, MIB)]
    tally.relabel("a", "b", "tcp", MIB)
    assert tally.rows() == [Carried("a", "b", "tcp", 2, 2 * MIB)]
    tally.relabel("a", "b", "tcp", MIB)  # nothing unlabelled left: nothing moves
    assert tally.rows() == [Carried("a", "b", "tcp", 2, 2 * MIB)]


@pytest.mark.parametrize("name", ["TCP", "t c p", "x" * 33, "tcp\n"])
def test_a_malformed_transport_is_refused(name):
    with pytest.raises(InvalidArgument, match="transport"):
        check_transport(name)


def test_a_report_records_the_transport_on_the_order_and_in_the_cluster_state():
    core, _ = make_core(nodes=2)
    order = core.submit_order(OrderSpec(Family("f"), [1, 2], NodeId("n0"), NodeId("n1"), 5000))
    core.report_order(order.order_id, OrderState.IN_FLIGHT)
    core.report_order(order.order_id, OrderState.COMMITTED, "", 3 * MIB, 2, "tcp")
    assert core.get_order(order.order_id).transport == "tcp"
    assert core.cluster_state().transports == (Carried("n0", "n1", "tcp", 1, 3 * MIB),)


def test_a_bad_transport_changes_nothing():
    core, _ = make_core(nodes=2)
    order = core.submit_order(OrderSpec(Family("f"), [1, 2], NodeId("n0"), NodeId("n1"), 5000))
    with pytest.raises(InvalidArgument):
        core.report_order(order.order_id, OrderState.COMMITTED, "", MIB, 2, "no such thing!")
    assert core.get_order(order.order_id).state is OrderState.ISSUED
    assert core.cluster_state().transports == ()


def test_a_commit_seen_in_kv_events_first_is_labelled_by_the_sources_report():
    core, _ = make_core(nodes=2)
    order = core.submit_order(OrderSpec(Family("f"), [1, 2], NodeId("n0"), NodeId("n1"), 5000))
    store(core, "n1", [1, 2], "f", HolderEventKind.COMMITTED)  # the target's events: every block landed
    assert core.get_order(order.order_id).state is OrderState.COMMITTED
    unlabelled = core.cluster_state().transports
    assert [(c.transport, c.orders) for c in unlabelled] == [("", 1)]
    core.report_order(order.order_id, OrderState.COMMITTED, "", 0, 2, "shm")  # the source's report, late
    assert core.get_order(order.order_id).transport == "shm"
    assert core.cluster_state().transports == (Carried("n0", "n1", "shm", 1, unlabelled[0].bytes),)
    core.report_order(order.order_id, OrderState.COMMITTED, "", 0, 2, "tcp")  # a repeat relabels nothing
    assert core.cluster_state().transports == (Carried("n0", "n1", "shm", 1, unlabelled[0].bytes),)


class Journal:
    """Records each transports_counted call; raises while `broken`."""

    def __init__(self):
        self.calls: list[list[Carried]] = []
        self.broken = False

    def transports_counted(self, rows):
        if self.broken:
            raise Unavailable("the state database could not be written")
        self.calls.append(list(rows))


def test_the_journal_gets_the_absolute_rows_each_change_made():
    journal = Journal()
    tally = TransportTally(journal)
    tally.add("a", "b", "tcp", 2 * MIB)
    tally.add("a", "b", "tcp", MIB)
    tally.add("a", "b", "", MIB)
    tally.relabel("a", "b", "shm", MIB)
    tally.relabel("a", "b", "shm", MIB)  # nothing unlabelled: no change, no write
    assert journal.calls == [[Carried("a", "b", "tcp", 1, 2 * MIB)], [Carried("a", "b", "tcp", 2, 3 * MIB)],
                             [Carried("a", "b", "", 1, MIB)],
                             [Carried("a", "b", "", 0, 0), Carried("a", "b", "shm", 1, MIB)]]  # 0 orders: gone


def test_a_journal_write_that_fails_changes_no_count():
    journal = Journal()
    tally = TransportTally(journal)
    tally.add("a", "b", "", MIB)
    journal.broken = True
    with pytest.raises(Unavailable):
        tally.add("a", "b", "tcp", MIB)
    with pytest.raises(Unavailable):
        tally.relabel("a", "b", "tcp", MIB)
    assert tally.rows() == [Carried("a", "b", "", 1, MIB)]


def test_restore_replaces_the_counts_without_journaling():
    journal = Journal()
    tally = TransportTally(journal)
    tally.add("x", "y", "grpc", MIB)
    tally.restore([Carried("a", "b", "tcp", 2, MIB), Carried("a", "b", "shm", 0, 0)])
    assert tally.rows() == [Carried("a", "b", "tcp", 2, MIB)]
    assert len(journal.calls) == 1
