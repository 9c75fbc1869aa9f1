"""Node events in a simulation (simulation.py; services/config/events.json
names them): an add brings a cold node (add_node); a kill takes
the node a name picks (victim) down at once: the scheduler hears (its event
stream closes), its KV is gone, and what it was serving, or a pull from it
was feeding, is re-sent by the reference router's rule (Simulation._resend,
migration.resend).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from speckv.loadgen.engines.fast import FastEngine
from speckv.loadgen.experiments.event_metrics import WINDOW_S as EVENT_WINDOW_S
from speckv.loadgen.experiments.metrics import request_key
from speckv.loadgen.experiments.replica_ledger import KVEventKind
from speckv.loadgen.workload.node_events import MOST_KV, EventKind, ScheduledEvent
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import NodeId

if TYPE_CHECKING:
    from speckv.loadgen.sim.simulation import Simulation


def node_event(sim: Simulation, event: ScheduledEvent) -> None:
    """Runs one scheduled node event now."""
    if event.kind is EventKind.ADD:
        add_node(sim)
    else:
        kill(sim, victim(sim, event.node))


def victim(sim: Simulation, name: str) -> NodeId:
    """The node a kill names: MOST_KV (most blocks in both tiers; ties:
    the lowest id) or an alive node's id."""
    alive = sim._alive()
    if not alive:
        raise InvalidArgument("a kill with no node alive")
    if name == MOST_KV:
        return max(alive, key=lambda n: (len(sim.kv[n]), -sim.ids.index(n)))
    if NodeId(name) not in alive:
        raise InvalidArgument(f"a kill names node {name!r}, which is not an alive node "
                              f"(alive: {', '.join(alive)})")
    return NodeId(name)


def kill(sim: Simulation, node: NodeId) -> None:
    """The node's kvstore and engine die now: the scheduler hears at once
    (its event stream closes), its KV is gone, and what it was serving,
    or a pull from it was feeding, is re-sent."""
    now = sim.queue.now()
    held = sim.kv[node].held_blocks()
    survivors = [sim.kv[n] for n in sim._alive() if n != node]
    # Only KV no survivor also holds is lost (a shared system prompt lives everywhere).
    lost = {h for h in held if not any(h in kv for kv in survivors)}
    outcome = sim.membership.killed(node, now, lost, len(sim._alive()) - 1)
    i = sim._next - 1
    while i >= 0 and sim._requests[i].arrival_s >= now - EVENT_WINDOW_S:
        sim.membership.arrived(request_key(i), sim._requests[i].block_hashes)
        i -= 1
    sim.core.node_lost(node, "simulated kill: its event stream closed")
    wake = sim._wakes[node]
    if wake is not None:
        wake.cancel()
    sim._wakes[node] = None
    sim.ledger.apply(node, KVEventKind.REMOVED, list(held), now)
    del sim._by_address[sim._addresses[node]]
    touched = [f for f in sim._inflight.values()
               if f.record.node_id == node or (f.waiting and f.record.fetch_from == node)]
    for flight in touched:
        sim._resend(flight, outcome)


def add_node(sim: Simulation) -> None:
    """One cold node joins and registers with the running scheduler."""
    now = sim.queue.now()
    node = NodeId(f"node-{len(sim.ids)}")
    settings, config = sim.settings, sim.config
    sim.ids.append(node)
    sizes = settings.sizes
    sim.kv[node] = sim._new_kv(node)
    address = sim._addresses[node] = f"sim-{node}:{len(sim.ids)}"
    sim._by_address[address] = sim.kv[node]
    sim.core.register_node(node, address, sizes, config.real_geometry)
    sim._gen[node] = sim.core.generation(node)
    sim.engines[node] = FastEngine(node, config.profile, config.engine, config.link,
                                   config.real_geometry.bytes_per_token)
    sim._wakes[node] = None
    sim._last_beat[node] = now
    sim.membership.added(node, now, len(sim._alive()))
