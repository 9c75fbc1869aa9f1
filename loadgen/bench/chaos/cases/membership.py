"""Chaos area `membership` (issue 27): `kill-kvstore-mid-burst`.

A burst of requests runs through the reference router (emulated engines in
this process, request migration on: loadgen/experiments/migration.py) onto
the chaos cluster's real scheduler and kvstores, while the victim node is
the source of replication orders whose reservations are open on the
survivors. Then the victim's kvstore is SIGKILLed and its engine dies with
it (ReferenceRouter.node_died, as `speckv bench e2e --events` does:
e2e/events.py). Four verdicts, each a case of its own:

- lost: every request of the burst completes served; those the kill took
  down are re-sent (at most once each: the migration limit).
- routes: no Route answer for the victim's families names it (as the node
  or as the node to fetch from) once node_timeout_s + ROUTE_MARGIN_S have
  passed since the kill; probed on a thread from the kill on.
- orders: the victim's orders open at the kill end FAILED, and the pages
  their reservations held on the survivors come back (KVStore.GetStats
  reserved_pages back to the pre-burst figure).
- index: the scheduler's index keeps none of its blocks (its NodeState
  counts none, and a Route for any chain it held names it nowhere), while
  a survivor's replica of its chain stays routable.

How orders are held open: the victim runs with a replication link cap
(VICTIM_FLAGS, given at cluster start: chaos.py), so of three orders of
ORDER_BLOCKS tiny blocks each, the first two fit the token bucket's
64 KiB burst and commit at once, and the third sleeps in the source's
pacing for seconds with its reservation open on its target
(services/kvstore/token_bucket.py). The victim is fixed
(node-1); the burst goes to it because its families' prefixes are seeded
there, so it is the node the burst is routed to.

The victim is started again on its port at the end (a case of its own), so
the run ends with the whole cluster up, as the hygiene area requires.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from speckv.loadgen.bench.chaos.common import BPB, TIMEOUT, TINY, cluster_state, nodes, order, put, stats, wait_until
from speckv.loadgen.bench.chaos.report import FAULTS_SEEN, SERVER_FAULTS, Figure, Verdict
from speckv.loadgen.bench.e2e.engines import emulated_engine
from speckv.loadgen.engines.driver import LiveEngines, TraceClock
from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.experiments.metrics import RequestRecord
from speckv.loadgen.experiments.migration import DEFAULT_MIGRATION_LIMIT
from speckv.loadgen.experiments.reference_router import ReferenceRouter
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger
from speckv.loadgen.workload.replay import TimeMap
from speckv.services.common.traces import TraceRequest
from speckv.v1 import common_pb2, scheduler_pb2

if TYPE_CHECKING:
    from speckv.loadgen.bench.chaos.cluster import ChaosCluster
    from speckv.loadgen.bench.chaos.cli import Context

AREA = "membership"
CASE = "kill-kvstore-mid-burst"
VICTIM = "node-1"
# 2e-5 Gbit/s = 2,500 B/s: of three 28 KiB orders the third goes 20 KiB
# beyond the token bucket's 64 KiB burst and waits about 8 s in the source's
# pacing, longer than the case takes to kill it. Only the replication the victim
# sends is capped; no other case replicates from node-1.
VICTIM_LINK_GBPS = 2e-5
VICTIM_FLAGS = ["--link-gbps", repr(VICTIM_LINK_GBPS)]
ORDER_BLOCKS = 56  # 28 KiB a tiny order; three exceed the 64 KiB bucket burst
FAMILIES = 3
PREFIX_BLOCKS = 8  # seeded on the victim per family: the burst's routes go there
REQUESTS = 12  # the burst, spread over the families
OUTPUT_TOKENS = 600  # decode of a few wall seconds on the emulated engine (speed 1): in flight at the kill
ROUTE_MARGIN_S = 1.0  # beyond node_timeout_s: scheduler ticks (0.1 s) and a loaded machine
PROBE_AFTER_S = 1.5  # Route probes kept up past the routes deadline, so the verdict has answers to judge
SETTLE_S = 15.0  # bound on each wait for the cluster to reach a state; a deadline, never a measurement
RESERVATION_LEASE_S = 5.0  # the chaos kvstores' --reservation-lease-s (chaos/cluster.py)
RESERVATION_SLACK_S = 5.0  # beyond it: the store's maintenance reaps lapsed leases, a loaded machine
BURST_S = 60.0  # bound on the burst completing after the kill
ORDER_HASH = 9_800_000
PREFIX_HASH = 9_810_000
SUFFIX_HASH = 9_820_000
OPEN_STATES = (common_pb2.ORDER_STATE_ISSUED, common_pb2.ORDER_STATE_IN_FLIGHT)


@dataclass(slots=True)
class Probe:
    """Route calls for the victim's chains in a loop on a thread:
    (monotonic time, node id, fetch-from node) of each answer."""

    cluster: "ChaosCluster"
    chains: list[tuple[str, list[int]]]  # (family, block hashes)
    answers: list[tuple[float, str, str]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "Probe":
        self._thread = threading.Thread(target=self._run, daemon=True, name="membership-probe")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        sched, i = self.cluster.scheduler(), 0
        while not self._stop.is_set():
            family, chain = self.chains[i % len(self.chains)]
            i += 1
            try:
                reply = sched.Route(scheduler_pb2.RouteRequest(
                    request_id=f"probe-{i}", block_hashes=chain, prompt_tokens=len(chain) * TINY.block_size + 1,
                    family=family), timeout=2.0)
                self.answers.append((time.monotonic(), reply.node_id, reply.fetch_from_node))
            except grpc.RpcError as exc:
                self.errors[exc.code().name] = self.errors.get(exc.code().name, 0) + 1
                if exc.code() in SERVER_FAULTS:  # counted by the hygiene area
                    FAULTS_SEEN.append(f"{AREA} Route probe: {exc.code().name}")
            self._stop.wait(0.03)


@dataclass(slots=True)
class Outcome:
    """What the scenario saw, judged by the cases after it."""

    survivors: list[str]
    reserved_before: dict[str, int]  # survivor -> reserved pages before the burst
    open_before: int  # ISSUED + IN_FLIGHT orders cluster-wide before the burst
    failed_before: int
    orders: list[str]  # the ids of the victim's orders
    reserved_at_kill: dict[str, int] = field(default_factory=dict)
    open_at_kill: int = 0
    on_victim_at_kill: int = 0  # burst requests decoding on the victim
    indexed_at_kill: int = 0  # blocks the scheduler's index counted on the victim (both tiers)
    killed_at: float = 0.0  # monotonic, once the process had exited
    exit_status: int = 0
    resent: int = 0
    lost_at_kill: int = 0
    done: list[RequestRecord] = field(default_factory=list)
    probe: Probe | None = None
    chains: list[tuple[str, list[int]]] = field(default_factory=list)  # every chain the victim held


def _request(family: int, index: int) -> TraceRequest:
    """A request of a family: its seeded prefix plus one block of its own."""
    prefix = [PREFIX_HASH + family * 100 + b for b in range(PREFIX_BLOCKS)]
    hashes = (*prefix, SUFFIX_HASH + index)
    return TraceRequest(0.0, len(hashes) * TINY.block_size + 1, OUTPUT_TOKENS, hashes, TINY.block_size,
                        f"membership-{family}")


def _order_counts(cluster: "ChaosCluster") -> dict[int, int]:
    return {c.state: c.count for c in cluster_state(cluster.scheduler()).orders}


def _open_orders(cluster: "ChaosCluster") -> int:
    counts = _order_counts(cluster)
    return sum(counts.get(s, 0) for s in OPEN_STATES)


def _reserved(cluster: "ChaosCluster", names: list[str]) -> dict[str, int]:
    return {n: stats(cluster.kvstore(n)).reserved_pages for n in names}


def run(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    if not wait_until(lambda: all(n.alive for n in nodes(cluster.scheduler()).values()), SETTLE_S):
        raise RuntimeError("not every node is alive before the burst")
    started = time.monotonic()
    try:
        outcome = _scenario(cluster)
        _verdicts(ctx, outcome)
    finally:
        def restart() -> Verdict:
            cluster.drop_channels(VICTIM)
            if not cluster.services[VICTIM].alive():
                cluster.restart(VICTIM)
            back = wait_until(lambda: nodes(cluster.scheduler())[VICTIM].alive, 40.0)
            return Verdict(back, f"re-registered and alive: {back}")

        rec.case(AREA, f"{VICTIM} started again on its port", "it re-registers and is alive", restart)
    rec.figure(AREA, Figure(f"{CASE} wall time, restart included", time.monotonic() - started, "s"))


def _scenario(cluster: "ChaosCluster") -> Outcome:
    sched = cluster.scheduler()
    survivors = [n for n in cluster.node_names if n != VICTIM]
    counts = _order_counts(cluster)
    outcome = Outcome(survivors, _reserved(cluster, survivors), _open_orders(cluster),
                      counts.get(common_pb2.ORDER_STATE_FAILED, 0), [])
    # Where each node registered (node-3: its forwarder): what an order must name.
    node_address = {n: state.address for n, state in nodes(sched).items()}

    # Seed the victim: the burst's prefixes (so Route sends the burst there) and the orders' chain.
    victim = cluster.kvstore(VICTIM)
    order_chain = list(range(ORDER_HASH, ORDER_HASH + ORDER_BLOCKS))
    put(victim, order_chain)
    outcome.chains.append(("chaos", order_chain))
    for f in range(FAMILIES):
        prefix = list(_request(f, 0).block_hashes[:PREFIX_BLOCKS])
        put(victim, prefix, family=f"membership-{f}")
        outcome.chains.append((f"membership-{f}", prefix))
    seeded = ORDER_BLOCKS + FAMILIES * PREFIX_BLOCKS
    if not wait_until(lambda: nodes(sched)[VICTIM].num_blocks >= seeded, SETTLE_S):
        raise RuntimeError(f"the scheduler never indexed the {seeded} blocks seeded on {VICTIM}")

    config = load_e2e_config()
    engines_box: list[ReferenceRouter] = []
    times = TimeMap(time.monotonic(), 0.0, 1.0)
    engines = {n: emulated_engine(config, n) for n in cluster.node_names}
    channels = {n: cluster.channel(n) for n in cluster.node_names}
    # Engine load heartbeats need each node's own certificate under mutual TLS; this
    # burst is placed by prefix, so one beat (refused, harmless: not logged) and then none.
    driver_log = logging.getLogger(LiveEngines.__module__)
    driver_level = driver_log.level
    driver_log.setLevel(logging.ERROR)
    live = LiveEngines(engines, TraceClock(times), cluster.channel("scheduler"),
                       lambda events: engines_box[0].on_engine_events(events), heartbeat_s=3600.0)
    done_lock = threading.Lock()

    def on_done(record: RequestRecord) -> None:
        with done_lock:
            outcome.done.append(record)

    router = ReferenceRouter(cluster.channel("scheduler"), channels, live, config.profile, ReplicaLedger(),
                             threading.Lock(), BPB, config.real_geometry.bytes_per_token, on_done=on_done, workers=4,
                             migration_limit=DEFAULT_MIGRATION_LIMIT)
    engines_box.append(router)
    live.start()
    try:
        _submit_orders(cluster, outcome, order_chain, node_address)
        _report_idle_engines(cluster)
        for i in range(REQUESTS):
            router.send(i, _request(i % FAMILIES, i))

        def decoding_on_victim() -> int:
            """Burst requests whose current attempt is decoding on the victim."""
            jobs = dict(router.jobs)
            return sum(1 for r in list(router.records) if r.node_id == VICTIM and r.request_id in jobs
                       and jobs[r.request_id].tokens_out >= 2 and jobs[r.request_id].finished_s is None)

        wait_until(lambda: decoding_on_victim() > 0, SETTLE_S, 0.02)
        outcome.reserved_at_kill = _reserved(cluster, outcome.survivors)
        outcome.open_at_kill = _open_orders(cluster) - outcome.open_before
        outcome.on_victim_at_kill = decoding_on_victim()
        state = nodes(cluster.scheduler())[VICTIM]
        outcome.indexed_at_kill = state.num_blocks + state.host_blocks
        outcome.probe = Probe(cluster, [(r.family, list(r.block_hashes)) for r in
                                        (_request(f, f) for f in range(FAMILIES))] + outcome.chains[:1]).start()
        outcome.exit_status = cluster.kill9(VICTIM)
        outcome.killed_at = time.monotonic()
        counts_died = router.node_died(VICTIM)
        outcome.resent, outcome.lost_at_kill = counts_died.resent, counts_died.lost
        probe_until = outcome.killed_at + cluster.spec.node_timeout_s + ROUTE_MARGIN_S + PROBE_AFTER_S
        wait_until(lambda: len(outcome.done) >= REQUESTS and time.monotonic() >= probe_until, BURST_S)
    finally:
        if outcome.probe is not None:
            outcome.probe.stop()
        live.stop()
        router.close()
        driver_log.setLevel(driver_level)
    outcome.chains += [(r.family, list(r.block_hashes)) for r in (_request(i % FAMILIES, i) for i in range(REQUESTS))]
    return outcome


def _report_idle_engines(cluster: "ChaosCluster") -> None:
    """Each node reports its (fresh, idle) engine's empty queue, with its own
    certificate, as a real engine's heartbeat would: the scheduler otherwise
    still counts the work earlier areas routed to the nodes (their kvstores'
    heartbeats carry no queue figures, and those areas' engines are gone),
    and would route the burst around a node it thinks is busy."""
    for name in cluster.node_names:
        cluster.scheduler(name).Heartbeat(scheduler_pb2.HeartbeatRequest(
            node_id=name, queued_tokens=0, num_waiting_requests=0, queued_prefill_ms=0.0), timeout=TIMEOUT)


def _submit_orders(cluster: "ChaosCluster", outcome: Outcome, chain: list[int], address: dict[str, str]) -> None:
    """Three orders from the victim, one to each survivor. The first alone:
    its target misses the victim's cached peer registry, which refreshes at
    most once a second and refuses a second miss meanwhile
    (services/kvstore/peers.py); after it the registry knows every node.
    The last waits in the victim's link cap with its reservation open."""
    sched = cluster.scheduler()
    first, *rest = sorted(outcome.survivors, reverse=True)
    committed = _order_counts(cluster).get(common_pb2.ORDER_STATE_COMMITTED, 0)
    for i, target in enumerate([first, *rest]):
        reply = sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order(
            VICTIM, target, address[target], chain)), timeout=TIMEOUT)
        outcome.orders.append(reply.order_id)
        if i == 0 and not wait_until(
                lambda: _order_counts(cluster).get(common_pb2.ORDER_STATE_COMMITTED, 0) > committed, SETTLE_S):
            raise RuntimeError(f"{VICTIM}'s first order to {target} did not commit")
    before = sum(outcome.reserved_before.values())
    if not wait_until(lambda: sum(_reserved(cluster, outcome.survivors).values()) > before, SETTLE_S, 0.05):
        raise RuntimeError(f"no reservation of {VICTIM}'s orders ever open on a survivor")


def _verdicts(ctx: "Context", o: Outcome) -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    sched = cluster.scheduler()
    timeout_s = cluster.spec.node_timeout_s

    def lost() -> Verdict:
        served = [r for r in o.done if r.served]
        failed = [f"{r.request_id}: {r.error[:80]}" for r in o.done if not r.served]
        missing = REQUESTS - len(o.done)
        retried = sum(1 for r in o.done if r.retried)
        ok = o.exit_status == -9 and len(served) == REQUESTS and o.resent > 0 and o.lost_at_kill == 0
        return Verdict(ok, f"exit {o.exit_status}; {len(served)} of {REQUESTS} served, {len(failed)} failed"
                           f"{': ' + '; '.join(failed[:3]) if failed else ''}, {missing} never completed; "
                           f"{o.on_victim_at_kill} decoding on {VICTIM} at the kill, {o.resent} re-sent by "
                           f"migration, {o.lost_at_kill} lost at the kill; {retried} marked retried")

    rec.case(AREA, f"{CASE}: no request lost",
             f"every one of the {REQUESTS} requests served; those decoding on {VICTIM} re-sent (at least one), "
             f"none lost (migration limit {DEFAULT_MIGRATION_LIMIT})", lost)

    def routes() -> Verdict:
        assert o.probe is not None
        deadline = o.killed_at + timeout_s + ROUTE_MARGIN_S
        after = [(t, n, f) for t, n, f in o.probe.answers if t >= deadline]
        named = [(t, n, f) for t, n, f in after if VICTIM in (n, f)]
        before_deadline = sum(1 for t, n, f in o.probe.answers if t < deadline and VICTIM in (n, f))
        to_victim = [t for t, n, f in o.probe.answers if VICTIM in (n, f) and t >= o.killed_at]
        last = max(to_victim) - o.killed_at if to_victim else 0.0
        rec.figure(AREA, Figure(f"{CASE}: last Route naming {VICTIM} after the kill", last, "s",
                                f"<= node_timeout_s {timeout_s:g} + {ROUTE_MARGIN_S:g}"))
        ok = bool(after) and not named
        return Verdict(ok, f"{len(o.probe.answers)} Route probes from the kill ({len(after)} after "
                           f"{timeout_s:g} + {ROUTE_MARGIN_S:g} s), {len(named)} of those name {VICTIM} "
                           f"({before_deadline} before); the last "
                           f"answer naming it came {last:.2f} s after the kill; errors {o.probe.errors or 'none'}")

    rec.case(AREA, f"{CASE}: no route to the dead node",
             f"no Route answer for its families names {VICTIM} (node or fetch source) once node_timeout_s "
             f"({timeout_s:g} s) + {ROUTE_MARGIN_S:g} s have passed since the kill", routes)

    def orders() -> Verdict:
        survivors = o.survivors
        closed = wait_until(lambda: _open_orders(cluster) <= o.open_before, SETTLE_S)
        by = o.killed_at + RESERVATION_LEASE_S + RESERVATION_SLACK_S
        freed = wait_until(lambda: _reserved(cluster, survivors) == o.reserved_before,
                           max(0.0, by - time.monotonic()))
        freed_after = time.monotonic() - o.killed_at
        failed = _order_counts(cluster).get(common_pb2.ORDER_STATE_FAILED, 0) - o.failed_before
        held = sum(o.reserved_at_kill.values()) - sum(o.reserved_before.values())
        if freed:
            rec.figure(AREA, Figure(f"{CASE}: survivors' reservations freed after the kill", freed_after, "s",
                                    f"the {RESERVATION_LEASE_S:g} s reservation lease from its Reserve, then reaped"))
        ok = o.open_at_kill > 0 and held > 0 and closed and failed >= o.open_at_kill and freed
        now = _reserved(cluster, survivors)
        return Verdict(ok, f"{len(o.orders)} orders from {VICTIM}, {o.open_at_kill} open at the kill, "
                           f"{failed} FAILED since, none open: {closed}; survivors' reserved pages before "
                           f"{o.reserved_before}, at the kill {o.reserved_at_kill}, now {now}; back to before: "
                           f"{freed} ({freed_after:.1f} s after the kill)")

    rec.case(AREA, f"{CASE}: its orders fail, survivors' reservations freed",
             f"every order of {VICTIM} open at the kill (at least one, its reservation open on a survivor) ends "
             "FAILED; the survivors' reserved pages (KVStore.GetStats) return to their pre-burst figure", orders)

    def index() -> Verdict:
        emptied = wait_until(lambda: (lambda n: n.num_blocks == 0 and n.host_blocks == 0)(nodes(sched)[VICTIM]),
                             SETTLE_S)
        state = nodes(sched)[VICTIM]
        named, replicas = [], 0
        for family, chain in o.chains:
            reply = sched.Route(scheduler_pb2.RouteRequest(
                request_id=f"index-{family}", block_hashes=chain, prompt_tokens=len(chain) * TINY.block_size + 1,
                family=family), timeout=TIMEOUT)
            if VICTIM in (reply.node_id, reply.fetch_from_node):
                named.append(family)
            if family == "chaos" and (reply.cached_blocks or reply.fetch_blocks):
                replicas += 1
        ok = o.indexed_at_kill > 0 and emptied and not named and replicas == 1
        return Verdict(ok, f"{VICTIM}'s index entry: {o.indexed_at_kill} blocks at the kill, now "
                           f"{state.num_blocks} device + {state.host_blocks} host, "
                           f"alive {state.alive}; Routes for its {len(o.chains)} chains naming it: "
                           f"{len(named)}{' (' + ', '.join(named[:3]) + ')' if named else ''}; its order chain still "
                           f"found on a survivor's committed replica: {replicas == 1}")

    rec.case(AREA, f"{CASE}: the index keeps none of its blocks",
             f"the scheduler counts no block on {VICTIM} and no Route for a chain it held names it; the order "
             "chain a survivor committed before the kill is still routed to that survivor", index)
