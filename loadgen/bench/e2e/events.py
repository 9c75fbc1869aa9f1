"""Node events in a live run (`speckv bench e2e --events NAME`, issue 27):
the same event sets as `speckv simulate --events` (workload/node_events.py),
played on the replay's wall clock.

At an event's trace time, mapped to the wall clock by the replay's TimeMap:
- kill: the node ("most-kv": the alive node whose kvstore holds the most
  blocks, both tiers, by the scheduler's index; ties: the lowest id) loses
  its kvstore to SIGKILL (LocalCluster.kill_node) and its engine at once
  (ReferenceRouter.node_died, which re-sends what it took down by the
  migration rule and counts requests_resent and requests_lost). The
  scheduler learns it from the kvstore's closed event stream.
- add: the cluster supervisor starts a new kvstore (LocalCluster.add_node:
  the next free id), which registers with the running scheduler; its
  engine joins the driver and the router once the scheduler counts it
  alive. Starting a process takes wall seconds: the node's lifetime (for
  utilisation) starts when it joined, later than the event's time.

What differs from the simulator's figures (membership.py): a kill's
affected requests are those of the *families* routed to the lost node
before it died (event_metrics.py's family rule), since the live run does
not track each node's blocks; recompute_tokens is not measured live (0).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

import grpc

from speckv.loadgen.engines.driver import LiveEngines
from speckv.loadgen.engines.emulated import Engine
from speckv.loadgen.experiments.event_metrics import EventOutcome
from speckv.loadgen.experiments.migration import DEFAULT_MIGRATION_LIMIT
from speckv.loadgen.experiments.reference_router import ReferenceRouter
from speckv.loadgen.workload.node_events import MOST_KV, EventKind, ScheduledEvent
from speckv.loadgen.workload.replay import TimeMap
from speckv.services.cluster.launcher import LocalCluster
from speckv.services.common.errors import InvalidArgument
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EventPlan:
    """A run's node events (absolute trace times) and the router's migration limit."""

    events: tuple[ScheduledEvent, ...]
    migration_limit: int = DEFAULT_MIGRATION_LIMIT


class LiveEvents:
    """Plays a plan's events on one thread; `outcomes` and `lifetimes`
    (node -> (joined, left), trace s) are read after stop()."""

    def __init__(self, plan: EventPlan, times: TimeMap, cluster: LocalCluster, router: ReferenceRouter,
                 engines: LiveEngines, scheduler: grpc.Channel, channels: dict[str, grpc.Channel],
                 open_channel: Callable[[str], grpc.Channel], new_engine: Callable[[str], Engine]) -> None:
        self._plan, self._times, self._cluster = plan, times, cluster
        self._router, self._engines = router, engines
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(scheduler)
        self._channels, self._open_channel, self._new_engine = channels, open_channel, new_engine
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-events", daemon=True)
        self.outcomes: list[EventOutcome] = []
        self.lifetimes: dict[str, tuple[float, float]] = {n: (-math.inf, math.inf) for n in channels}
        self.error: BaseException | None = None

    def start(self) -> "LiveEvents":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120.0)

    def alive_channels(self) -> dict[str, grpc.Channel]:
        return {n: c for n, c in self._channels.items() if self.lifetimes.get(n, (0.0, math.inf))[1] == math.inf}

    def _run(self) -> None:
        for event in self._plan.events:
            if self._stop.wait(max(0.0, self._times.to_clock(event.at_s) - time.monotonic())):
                return
            try:
                if event.kind is EventKind.KILL:
                    self._kill(event)
                else:
                    self._add(event)
            except Exception as exc:  # noqa: BLE001 - reported after the run, never a dead thread
                log.exception("node event %s at %.1f s failed", event.kind.value, event.at_s)
                self.error = exc
                return

    def _now(self) -> float:
        return self._times.to_trace(time.monotonic())

    def _alive(self) -> list[scheduler_pb2.NodeState]:
        state = self._scheduler.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=10.0)
        return [n for n in state.nodes if n.alive and n.node_id in self.alive_channels()]

    def _victim(self, name: str) -> str:
        alive = self._alive()
        if not alive:
            raise InvalidArgument("a kill with no node alive")
        if name == MOST_KV:
            return min(alive, key=lambda n: (-(n.num_blocks + n.host_blocks), n.node_id)).node_id
        if name not in {n.node_id for n in alive}:
            raise InvalidArgument(f"a kill names node {name!r}, which is not an alive node "
                                  f"(alive: {', '.join(n.node_id for n in alive)})")
        return name

    def _kill(self, event: ScheduledEvent) -> None:
        node = self._victim(event.node)
        families = frozenset(r.family for r in list(self._router.records) if r.node_id == node)
        self._cluster.kill_node(node)
        counts = self._router.node_died(node)
        at = self._now()
        joined, _ = self.lifetimes.get(node, (-math.inf, math.inf))
        self.lifetimes[node] = (joined, at)
        outcome = EventOutcome("kill", event.at_s, node, families, requests_resent=counts.resent,
                               requests_lost=counts.lost, alive_nodes_after=len(self.alive_channels()))
        self.outcomes.append(outcome)
        log.warning("node event: killed %s at trace %.1f s (scheduled %.1f): %d re-sent, %d lost", node, at,
                    event.at_s, counts.resent, counts.lost)

    def _add(self, event: ScheduledEvent) -> None:
        service = self._cluster.add_node()
        channel = self._open_channel(service.address)
        self._channels[service.name] = channel
        self._engines.add(service.name, self._new_engine(service.name))
        self._router.add_node(service.name, channel)
        at = self._now()
        self.lifetimes[service.name] = (at, math.inf)
        self.outcomes.append(EventOutcome("add", event.at_s, service.name,
                                          alive_nodes_after=len(self.alive_channels())))
        log.warning("node event: added %s, joined at trace %.1f s (scheduled %.1f)", service.name, at, event.at_s)


def check_plan(plan: EventPlan | None, engine_kind: str) -> None:
    if plan is not None and engine_kind != "emulated":
        raise InvalidArgument(f"--events runs with the emulated engines only, not --engine {engine_kind} (a "
                              "migrated request's streamed tokens are not rebuilt into model tokens)")
    if plan is not None and plan.migration_limit < 0:
        raise InvalidArgument(f"--migration-limit={plan.migration_limit}: must be >= 0")
