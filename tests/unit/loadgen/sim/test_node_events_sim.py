"""Node loss and addition in the simulator (membership.py): a scripted
three-node loss and a scale-out, in virtual time, on the live scheduler core."""
from __future__ import annotations

import dataclasses

import pytest

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.experiments.event_metrics import event_figures
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.node_events import EventKind, ScheduledEvent
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import NodeId
from speckv.services.common.traces import TraceRequest

CONFIG = load_e2e_config()
BLOCK = CONFIG.block_tokens


def chain(family: int, blocks: int = 8) -> tuple[int, ...]:
    return tuple(family * 1000 + i for i in range(blocks))


def workload(families: int = 6, per_family: int = 4, gap_s: float = 2.0, output: int = 400) -> list[TraceRequest]:
    """Each family's requests share an 8-block prefix; turns of a family come gap_s apart."""
    out = [TraceRequest(t * gap_s + f * 0.1, 8 * BLOCK + 10, output, chain(f), BLOCK, f"fam{f}")
           for t in range(per_family) for f in range(families)]
    return sorted(out, key=lambda r: r.arrival_s)


def simulate(events, nodes: int = 3, policy: str = "none", requests=None, migration_limit: int = 1):
    settings = dataclasses.replace(SimSettings.from_e2e(CONFIG, nodes=nodes), drain_s=300.0)
    sim = Simulation(CONFIG, settings, policy, requests or workload(), node_events=events,
                     migration_limit=migration_limit)
    return sim, sim.run()


def held_by(sim: Simulation, node: str) -> int:
    return {n.view.node_id: n.view.num_blocks for n in sim.core.cluster_state().nodes}[node]


def test_a_killed_node_gets_no_routes_its_index_entries_go_and_its_requests_are_resent():
    sim, run = simulate([ScheduledEvent(EventKind.KILL, 2.5, "node-1")])
    kill = run.node_events[0]
    assert kill.node == "node-1" and kill.at_s == 2.5
    assert all(r.served for r in run.records)  # nothing lost: every request on it was re-sent once
    assert kill.requests_resent == sum(r.retried for r in run.records) > 0
    assert kill.requests_lost == 0
    assert not [r for r in run.records if r.node_id == "node-1" and r.arrival_s >= 2.5]
    assert not [r for r in run.records if r.retried and r.node_id == "node-1"]
    assert held_by(sim, "node-1") == 0 and "node-1" in sim.membership.dead
    assert kill.families  # it held prefixes when it died
    # Affected: the requests whose prompts hold its blocks, before (they made them) and after (they miss them).
    by_id = {r.request_id: r for r in run.records}
    assert kill.affected_requests and all(by_id[i].family in kill.families for i in kill.affected_requests)
    assert {by_id[i].arrival_s < 2.5 for i in kill.affected_requests} == {True, False}
    assert run.lifetimes["node-1"][1] == 2.5


def test_a_request_in_decode_keeps_its_first_token_and_continues_elsewhere():
    # One long request alone: it is decoding on its node when the node dies at 5 s.
    request = TraceRequest(0.0, 8 * BLOCK + 10, 2000, chain(1), BLOCK, "solo")
    sim, run = simulate([ScheduledEvent(EventKind.KILL, 5.0, "most-kv")], requests=[request])
    record = run.records[0]
    assert record.served and record.retried and run.node_events[0].requests_resent == 1
    assert record.ttft_ms is not None and record.ttft_ms < 5000  # the first token came before the kill
    assert record.e2e_ms is not None and record.e2e_ms > 5000
    assert record.node_id != run.node_events[0].node


def test_a_request_whose_node_dies_twice_past_the_limit_is_lost():
    request = TraceRequest(0.0, 8 * BLOCK + 10, 4000, chain(1), BLOCK, "solo")
    events = [ScheduledEvent(EventKind.KILL, 5.0, "most-kv"), ScheduledEvent(EventKind.KILL, 10.0, "most-kv")]
    sim, run = simulate(events, requests=[request])
    first, second = run.node_events
    assert first.requests_resent == 1 and second.requests_lost == 1
    assert run.records[0].error.startswith("lost") and not run.records[0].served
    sim, run = simulate(events, requests=[request], migration_limit=2)
    assert run.records[0].served and run.node_events[1].requests_resent == 1


def test_the_lost_nodes_blocks_recomputed_later_count_once():
    sim, run = simulate([ScheduledEvent(EventKind.KILL, 2.5, "most-kv")])
    kill = run.node_events[0]
    assert kill.recompute_tokens > 0 and kill.recompute_tokens % BLOCK == 0
    figures = event_figures(run.records, kill)
    assert figures.affected_families == len(kill.families) and figures.requests_lost == 0


def test_a_killed_node_may_not_be_an_unknown_one():
    with pytest.raises(InvalidArgument, match="node-9"):
        simulate([ScheduledEvent(EventKind.KILL, 1.0, "node-9")])


def test_an_added_node_registers_cold_and_takes_requests():
    # Families 4-7 first arrive after the add (at 0.4-0.7 s): a cold node is where new prefixes go.
    sim, run = simulate([ScheduledEvent(EventKind.ADD, 0.35)], nodes=2,
                        requests=workload(families=8, per_family=6, gap_s=1.0))
    add = run.node_events[0]
    assert add.node == "node-2" and add.alive_nodes_after == 3
    assert sim.core.live_node_count() == 3 and NodeId("node-2") in sim.kv
    served_there = [r for r in run.records if r.node_id == "node-2"]
    assert served_there and min(r.arrival_s for r in served_there) >= 0.35
    figures = event_figures(run.records, add)
    assert figures.scale_out["new_node_requests"] == len([r for r in served_there if r.arrival_s < 60.35])


def test_without_events_nothing_changes():
    _, plain = simulate([])
    assert not plain.node_events and not any(r.retried for r in plain.records)
    assert set(plain.lifetimes) == {"node-0", "node-1", "node-2"}
