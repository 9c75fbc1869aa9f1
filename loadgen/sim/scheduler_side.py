"""The scheduler's side of a simulation (simulation.py): its tick, which
issues orders, each order carried out on the simulated nodes (a replica
copied over the network and committed, a prefetch over the host link, a
stage over the disk link, a retain) and reported back as the live kvstore agents report theirs, the
heartbeat rounds that carry each node's load, and the predictor's forecast
polls. Each reschedules itself on the event queue; ticks and polls run after
arrivals and engine events at the same instant, heartbeats after ticks.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from speckv.loadgen.experiments.replica_ledger import KVEventKind
from speckv.loadgen.sim.network import Transfer
from speckv.loadgen.sim.staging import StageRead, after_disk, stage_up
from speckv.services.common.errors import SpeckvError
from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.holder_index import HolderEventKind
from speckv.services.scheduler.orders import ActionKind, Order, OrderState

if TYPE_CHECKING:
    from speckv.loadgen.sim.simulation import Simulation

TICK_PRIORITY, HEARTBEAT_PRIORITY = 1, 2  # after arrivals and engine events at the same instant


def tick(sim: Simulation) -> None:
    membership = sim.membership
    for order in sim.core.tick():
        if membership.outcomes:
            membership.ordered(order.spec.target, sim.queue.now())
        replicate(sim, order)
    sim.queue.after(sim.settings.tick_s, partial(tick, sim), TICK_PRIORITY)


def replicate(sim: Simulation, order: Order) -> None:
    spec = order.spec
    if not sim.kv[spec.source].holds_all(spec.block_hashes):
        report(sim, order, OrderState.FAILED, "source no longer holds the chain")
        return
    if spec.action is ActionKind.PREFETCH:
        prefetch(sim, order)
        return
    if spec.action is ActionKind.STAGE:
        stage(sim, order)
        return
    if spec.action is ActionKind.RETAIN:
        now = sim.queue.now()
        retained = sim.kv[spec.target].retain(spec.block_hashes, now + spec.lease_ms / 1e3, now)
        report(sim, order, OrderState.COMMITTED, "retained", 0, retained)
        return
    # REPLICATE and REDUNDANT (ActionKind.copies): the same copy over the network.
    report(sim, order, OrderState.IN_FLIGHT)
    nbytes = len(spec.block_hashes) * sim.config.real_bytes_per_block
    sim.network.start(spec.source, spec.target, nbytes, partial(commit, sim, order))


def commit(sim: Simulation, order: Order, transfer: Transfer) -> None:
    spec, now = order.spec, sim.queue.now()
    target = NodeId(spec.target)
    if target in sim.membership.dead or NodeId(spec.source) in sim.membership.dead:
        report(sim, order, OrderState.FAILED, "a node of the transfer died")
        return
    tier = spec.tier or Tier.DEVICE
    out = sim.kv[target].put(spec.block_hashes, now, lease_deadline=now + spec.lease_ms / 1e3, tier=tier)
    sim.ledger.apply(target, KVEventKind.COMMITTED, out.stored, now, order.order_id, spec.family)
    sim._apply(target, out, spec.block_hashes[0], spec.family, now, HolderEventKind.COMMITTED, tier)
    report(sim, order, OrderState.COMMITTED, "committed", transfer.nbytes, len(spec.block_hashes))


def prefetch(sim: Simulation, order: Order) -> None:
    """Copies the node's host-only blocks of the prefix over its host link;
    they enter its device tier when the copy lands (as the live store's
    promote publishes them only once copied), if the node still holds the
    whole prefix then."""
    spec, node = order.spec, NodeId(order.spec.target)
    blocks = sim.kv[node].host_only(spec.block_hashes, len(spec.block_hashes))
    if not blocks or sim.host_links is None:
        report(sim, order, OrderState.COMMITTED, "nothing to promote")
        return
    report(sim, order, OrderState.IN_FLIGHT)
    stage_up(sim, node, blocks, sim.kv[node].disk_only_hashes(spec.block_hashes, len(spec.block_hashes)),
             partial(prefetched, sim, order, blocks))


def prefetched(sim: Simulation, order: Order, blocks: int, _transfer: Transfer) -> None:
    spec, node, now = order.spec, NodeId(order.spec.target), sim.queue.now()
    kv = sim.kv[node]
    if node in sim.membership.dead or not kv.holds_all(spec.block_hashes):
        report(sim, order, OrderState.FAILED, "the prefix left the node before the prefetch landed")
        return
    sim._apply(node, kv.put(spec.block_hashes, now, promote=True), spec.block_hashes[0], spec.family, now)
    report(sim, order, OrderState.COMMITTED, "prefetched", 0, blocks)


def stage(sim: Simulation, order: Order) -> None:
    """Reads the node's disk-only blocks of the prefix over its disk link
    (joining a stage in flight for those it reads: staging.after_disk);
    they enter its host tier when the read lands (SimKVNode.stage), if the
    node still holds the whole prefix then. Until then a request needing
    them joins this read."""
    spec, node = order.spec, NodeId(order.spec.target)
    hashes = sim.kv[node].disk_only_hashes(spec.block_hashes, len(spec.block_hashes))
    if not hashes or sim.disk_links is None:
        report(sim, order, OrderState.COMMITTED, "nothing to stage")
        return
    report(sim, order, OrderState.IN_FLIGHT)
    box: list[StageRead | None] = [None]
    box[0] = after_disk(sim, node, hashes, partial(staged, sim, order, box), stage=True)


def staged(sim: Simulation, order: Order, box: list[StageRead | None]) -> None:
    spec, node, now = order.spec, NodeId(order.spec.target), sim.queue.now()
    kv = sim.kv[node]
    try:
        if node in sim.membership.dead or not kv.holds_all(spec.block_hashes):
            report(sim, order, OrderState.FAILED, "the prefix left the node before the stage landed")
            return
        out = kv.stage(spec.block_hashes, now)
        sim._apply(node, out, spec.block_hashes[0], spec.family, now, tier=Tier.HOST)
        report(sim, order, OrderState.COMMITTED, "staged", 0, len(out.stored))
    finally:
        if box[0] is not None:
            sim.stage_reads.end(node, box[0])  # its joiners go on to their host copies


def report(sim: Simulation, order: Order, state: OrderState, message: str = "", nbytes: int = 0, blocks: int = 0) -> None:
    try:
        sim.core.report_order(order.order_id, state, message, nbytes, blocks)
    except SpeckvError:
        pass  # expired or already committed from the KV event: the lifecycle has the final word


def heartbeat_round(sim: Simulation) -> None:
    now = sim.queue.now()
    dead = sim.membership.dead
    due = [n for n in sim.ids if n not in dead
           and (n in sim._dirty or now - sim._last_beat[n] >= sim.settings.liveness_s)]
    sim._dirty.clear()
    for node in due:
        engine = sim.engines[node]
        sim._handle(node, engine.advance(now))
        load = engine.load()
        kv = sim.kv[node]
        sim.core.heartbeat(node, NodeLoad(load.queued_tokens, load.running_tokens, kv.free_pages,
                                           load.running_requests, load.waiting_requests,
                                           load.queued_prefill_ms, kv.retained_blocks(now)))
        sim._last_beat[node] = now
        sim._wake(node)
    sim.queue.after(sim.settings.heartbeat_s, partial(heartbeat_round, sim), HEARTBEAT_PRIORITY)


def poll_forecasts(sim: Simulation) -> None:
    now = sim.queue.now()
    assert sim._forecasts is not None  # run() polls only a simulation that runs the predictor
    for f in sim._forecasts.forecast(now, sim.settings.forecast_horizon_s, 5):
        sim.forecast_log.append((now, str(f.family), f.expected_count))
    sim.queue.after(sim.settings.forecast_poll_s, partial(poll_forecasts, sim), TICK_PRIORITY)
