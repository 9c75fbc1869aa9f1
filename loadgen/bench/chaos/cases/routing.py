"""Chaos area `routing` (issue 43, items 7 and 8): `kill-scheduler-mid-replay`.

A replay runs through the reference router (emulated engines in this
process) whose routes go through the fail-open routing client
(services/client/routing.py) onto the chaos cluster's real scheduler and
kvstores. Mid-replay the scheduler is SIGKILLed; the replay goes on while it
is down; then it is started again on its port and --state-dir, and the
replay goes on once more. Two verdicts, each a case of its own:

- lost: every request of the replay is served (0 lost), those sent while
  the scheduler was down placed by the client's fallback (at least one).
- back: once the scheduler serves again and every node re-registered,
  the client's breaker closes within RETURN_S, and every route of the
  last phase comes from the scheduler.

Figures (reported, never judged): the fallback's routes, the time from the
restarted scheduler's first answer to the breaker closing, and mean TTFT of
the requests routed by the scheduler and by the fallback (the fallback
knows no cache but the chosen node's own prefix, found by a Lookup, so it
degrades toward the `none` policy's TTFT).

The scheduler is restarted in the case itself, so the run ends with the
whole cluster up, as the hygiene area requires.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from speckv.loadgen.bench.chaos.common import BPB, TINY, nodes, wait_until
from speckv.loadgen.bench.chaos.report import Figure, Verdict
from speckv.loadgen.bench.e2e.engines import emulated_engine
from speckv.loadgen.engines.driver import LiveEngines, TraceClock
from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.experiments.metrics import RequestRecord
from speckv.loadgen.experiments.reference_router import ReferenceRouter
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger
from speckv.loadgen.workload.replay import TimeMap
from speckv.services.client.breaker import BreakerSettings, BreakerState
from speckv.services.client.routing import SCHEDULER_CHANNEL_OPTIONS, ClientSettings, RoutingClient
from speckv.services.common.rpc.tls import dial
from speckv.services.common.traces import TraceRequest

if TYPE_CHECKING:
    from speckv.loadgen.bench.chaos.cli import Context

AREA = "routing"
CASE = "kill-scheduler-mid-replay"
BEFORE, DOWN, AFTER = 8, 16, 8  # requests sent in each phase
GAP_S = 0.03  # between two requests of the replay
FAMILIES = 4
HASH = 9_900_000
OUTPUT_TOKENS = 16
OPEN_S = 0.5  # the client's breaker: half-open after this
RETURN_S = 20.0  # bound on the breaker closing once the scheduler serves again; a deadline, not a measurement
SETTLE_S = 40.0  # bound on each wait for the cluster to reach a state


@dataclass(slots=True)
class Replay:
    """The router (set once built: it reports to on_done), its client and what completed."""

    client: RoutingClient
    router: ReferenceRouter | None = None
    done: list[RequestRecord] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # request id -> phase it was sent in
    sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_done(self, record: RequestRecord) -> None:
        with self.lock:
            self.done.append(record)

    def send(self, count: int, phase: str) -> None:
        for _ in range(count):
            family = HASH + (self.sent % FAMILIES) * 100
            hashes = (family, family + 1, HASH + 50_000 + self.sent)
            request = TraceRequest(0.0, len(hashes) * TINY.block_size + 3, OUTPUT_TOKENS, hashes,
                                   TINY.block_size, f"routing-{self.sent % FAMILIES}")
            self.sources[f"r{self.sent}"] = phase
            assert self.router is not None
            self.router.send(self.sent, request)
            self.sent += 1
            time.sleep(GAP_S)

    def drained(self) -> bool:
        router = self.router
        assert router is not None
        return wait_until(lambda: router.pending() == 0, SETTLE_S)


@dataclass(slots=True)
class Outcome:
    exit_status: int = 0
    fallback_down: int = 0  # fallback routes while the scheduler was down
    scheduler_before: int = 0
    closed: bool = False
    close_s: float = float("nan")  # from the restarted scheduler serving to the breaker closing
    last_phase_scheduler: int = 0
    last_phase_fallback: int = 0
    nodes_back: bool = False
    drained: bool = True


def run(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    if not wait_until(lambda: all(n.alive for n in nodes(cluster.scheduler()).values()), SETTLE_S):
        raise RuntimeError("not every node is alive before the replay")
    config = load_e2e_config()
    channel = dial(cluster.services["scheduler"].address, cluster.admin, "scheduler", SCHEDULER_CHANNEL_OPTIONS)
    kv = {n: cluster.channel(n) for n in cluster.node_names}
    client = RoutingClient(channel, nodes={n: cluster.services[n].address for n in cluster.node_names},
                           settings=ClientSettings(deadline_s=2.0, breaker=BreakerSettings(2, OPEN_S)))
    box: list[ReferenceRouter] = []
    # The engines' load heartbeats need each node's own certificate; these carry the admin's, so one beat
    # (refused, harmless) and then none: the replay is placed by the client, not by load.
    driver_log = logging.getLogger(LiveEngines.__module__)
    level = driver_log.level
    driver_log.setLevel(logging.ERROR)
    live = LiveEngines({n: emulated_engine(config, n) for n in cluster.node_names},
                       TraceClock(TimeMap(time.monotonic(), 0.0, 1.0)), channel,
                       lambda events: box[0].on_engine_events(events), heartbeat_s=3600.0)
    replay = Replay(client)
    router = ReferenceRouter(channel, kv, live, config.profile, ReplicaLedger(), threading.Lock(), BPB,
                             config.real_geometry.bytes_per_token, on_done=replay.on_done, workers=4, client=client)
    replay.router = router
    box.append(router)
    live.start()
    started = time.monotonic()
    outcome = Outcome()
    try:
        _scenario(ctx, replay, outcome)
    finally:
        live.stop()
        router.close()
        channel.close()
        driver_log.setLevel(level)
        if not cluster.services["scheduler"].alive():
            cluster.drop_channels("scheduler")
            cluster.restart("scheduler")
    _verdicts(ctx, replay, outcome)
    rec.figure(AREA, Figure(f"{CASE} wall time, restart included", time.monotonic() - started, "s"))


def _scenario(ctx: "Context", replay: Replay, outcome: Outcome) -> None:
    cluster, client = ctx.cluster, replay.client
    replay.send(BEFORE, "before")
    outcome.drained &= replay.drained()
    outcome.scheduler_before = client.counters().routes_scheduler
    outcome.exit_status = cluster.kill9("scheduler")
    fallback_at_kill = client.counters().routes_fallback
    replay.send(DOWN, "down")
    outcome.drained &= replay.drained()
    outcome.fallback_down = client.counters().routes_fallback - fallback_at_kill
    cluster.drop_channels("scheduler")
    cluster.restart("scheduler")
    serving_at = time.monotonic()
    fresh = cluster.scheduler()
    outcome.nodes_back = wait_until(lambda: all(n.alive for n in nodes(fresh).values()), SETTLE_S)

    def closed_after_one_more() -> bool:
        replay.send(1, "probe")  # a probe once the breaker half-opens
        return client.breaker_state is BreakerState.CLOSED

    outcome.closed = wait_until(closed_after_one_more, RETURN_S, interval_s=0.05)
    outcome.close_s = time.monotonic() - serving_at
    outcome.drained &= replay.drained()  # the last probe's route is counted before the last phase starts
    before = client.counters()
    replay.send(AFTER, "after")
    outcome.drained &= replay.drained()
    after = client.counters()
    outcome.last_phase_scheduler = after.routes_scheduler - before.routes_scheduler
    outcome.last_phase_fallback = after.routes_fallback - before.routes_fallback


def _verdicts(ctx: "Context", replay: Replay, o: Outcome) -> None:
    rec = ctx.recorder
    counters = replay.client.counters()

    def lost() -> Verdict:
        served = [r for r in replay.done if r.served]
        failed = [f"{r.request_id}: {r.error[:80]}" for r in replay.done if not r.served]
        missing = replay.sent - len(replay.done)
        ok = o.exit_status == -9 and len(served) == replay.sent and o.fallback_down > 0 and o.drained
        return Verdict(ok, f"exit {o.exit_status}; {len(served)} of {replay.sent} served, {len(failed)} failed"
                           f"{': ' + '; '.join(failed[:3]) if failed else ''}, {missing} never completed; "
                           f"{o.scheduler_before} routed by the scheduler before the kill, {o.fallback_down} by "
                           f"the client's fallback while it was down; scheduler errors {counters.errors_by_code}")

    rec.case(AREA, f"{CASE}: no request lost",
             f"every request of the replay served ({BEFORE} before the kill, {DOWN} while the scheduler is down, "
             f"then more); those sent while it was down placed by the client's fallback", lost)

    def back() -> Verdict:
        ok = o.nodes_back and o.closed and o.last_phase_scheduler == AFTER and o.last_phase_fallback == 0
        return Verdict(ok, f"every node alive again: {o.nodes_back}; breaker closed: {o.closed} "
                           f"({o.close_s:.1f} s after the restart served); last phase: {o.last_phase_scheduler} of "
                           f"{AFTER} routed by the scheduler, {o.last_phase_fallback} by the fallback; breaker "
                           f"opened {counters.breaker_opens} time(s)")

    rec.case(AREA, f"{CASE}: routing returns to the scheduler",
             f"once the scheduler serves again on its port, the client's breaker closes within {RETURN_S:g} s "
             f"and every route of the last {AFTER} comes from the scheduler", back)
    rec.figure(AREA, Figure(f"{CASE}: routes placed by the fallback", counters.routes_fallback, "routes"))
    if o.closed:
        rec.figure(AREA, Figure(f"{CASE}: restart served -> breaker closed", o.close_s, "s",
                                f"<= open_s {OPEN_S:g} + the nodes' re-registration"))
    for phase, label in (("before", "scheduler"), ("down", "fallback")):
        ttfts = [r.ttft_ms for r in replay.done if r.served and replay.sources.get(r.request_id) == phase]
        if ttfts:
            rec.figure(AREA, Figure(f"{CASE}: mean TTFT, routed by the {label}", sum(ttfts) / len(ttfts), "ms"))
