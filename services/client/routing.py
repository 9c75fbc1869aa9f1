"""RoutingClient: the scheduler's Route for an inference router, failing open.

route() asks the scheduler (Scheduler.Route) within `deadline_s` while the
circuit breaker (breaker.py) allows it, and otherwise, or when the call
fails, places the request itself (fallback.py): a request is never failed
because the scheduler is slow or down.

Scheduler replicas: given several channels (one per replica; every replica
answers Route), or a target list it dials itself (`"HOST:PORT,dns:NAME:PORT"`:
a `dns:` entry is every address NAME resolves to, re-resolved every 5 s, so
replicas that come and go are followed: replica_set.py), the client spreads
requests over them round-robin, one breaker each. A replica that fails a call for a scheduler fault (below) is
passed over and the next one allowed is asked, each within its own
`deadline_s`; only when none answers does the request fall back. So a dead
replica costs the requests that meet it at most one extra deadline until its
breaker opens, and none falls back while another replica is up. Only a client that knows no node at
all (none seeded, none learned from an answer, or every one marked down)
raises Unavailable.

Which failures count against the scheduler (the breaker's failures):
UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL, UNKNOWN,
ABORTED and CANCELLED. Any other status (INVALID_ARGUMENT, PERMISSION_DENIED,
...) is the request's or the caller's fault: that request falls back, but the
scheduler counts as up. Every failure is counted by its code.

Reports go off the request path: the arrival of a request the fallback
placed (the scheduler reports those it routes itself), and turn ends, each on
its own bounded queue and thread (reports.py), when a predictor channel is
given. done(request_id) must follow every route: it frees the request's load
in the client's view (fallback.KnownNodes).
"""
from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import grpc

from speckv.services.client.batches import BatchSettings, BatchStats
from speckv.services.client.breaker import BreakerSettings, BreakerState
from speckv.services.client.fallback import FallbackSettings, FallbackStrategy, KnownNodes
from speckv.services.client.replica_set import SCHEDULER_CHANNEL_OPTIONS, Dial, Discovery, Replica, ReplicaSet
from speckv.services.client.reports import ArrivalReporter, TurnEndReporter
from speckv.services.common.clock import Clock, SystemClock
from speckv.services.common.errors import Unavailable, require
from speckv.services.common.ids import default_family
from speckv.v1 import scheduler_pb2

# Codes that say the scheduler is unwell, rather than that the request was wrong.
SCHEDULER_FAULTS = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED})

__all__ = ["SCHEDULER_CHANNEL_OPTIONS", "SCHEDULER_FAULTS", "ClientSettings", "Dial", "Discovery", "RouteSource",
           "Routed", "RoutingClient"]


class RouteSource(enum.Enum):
    SCHEDULER = "scheduler"
    FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """deadline_s: the most one Route call may take (s, > 0); the rest: breaker.py,
    fallback.py, batches.py (the report queues); report_timeout_s: one report call's deadline."""

    deadline_s: float = 0.5
    breaker: BreakerSettings = BreakerSettings()
    fallback: FallbackSettings = FallbackSettings()
    reports: BatchSettings = BatchSettings()
    report_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        require(self.deadline_s > 0, f"deadline_s must be > 0, not {self.deadline_s}")
        require(self.report_timeout_s > 0, f"report_timeout_s must be > 0, not {self.report_timeout_s}")


@dataclass(frozen=True, slots=True)
class Routed:
    """Where a request goes. From the scheduler: its whole answer (`reply`).
    From the fallback: the node and its address only; nothing is known to be
    cached or worth fetching (reply is None, the block counts 0)."""

    node_id: str
    address: str
    source: RouteSource
    family: str
    reply: scheduler_pb2.RouteResponse | None = None

    @property
    def cached_blocks(self) -> int:
        return self.reply.cached_blocks if self.reply else 0

    @property
    def fetch_from_node(self) -> str:
        return self.reply.fetch_from_node if self.reply else ""

    @property
    def fetch_blocks(self) -> int:
        return self.reply.fetch_blocks if self.reply else 0

    @property
    def promote_blocks(self) -> int:
        return self.reply.promote_blocks if self.reply else 0

    @property
    def disk_blocks(self) -> int:
        """Of promote_blocks, those the node reads off its disk tier first (0 from the fallback)."""
        return self.reply.disk_blocks if self.reply else 0

    @property
    def expected_ttft_ms(self) -> float:
        """The scheduler's estimate; 0.0 from the fallback (no estimate)."""
        return self.reply.expected_ttft_ms if self.reply else 0.0


@dataclass(slots=True)
class ClientCounters:
    """Cumulative since the client started. routes = routes_scheduler + routes_fallback."""

    routes: int = 0
    routes_scheduler: int = 0
    routes_fallback: int = 0
    scheduler_errors: int = 0
    errors_by_code: dict[str, int] = field(default_factory=dict)
    breaker_opens: int = 0  # all replicas' breakers together
    breaker_state: str = BreakerState.CLOSED.value  # closed while any replica's breaker lets calls through
    routes_retried: int = 0  # answered by a replica after another one failed them
    arrivals: BatchStats | None = None  # None: no predictor channel
    turn_ends: BatchStats | None = None


class RoutingClient:
    """The module docstring's client. nodes: node id -> address the router
    knows up front (may be empty: nodes are also learned from the scheduler's
    answers). predictor: where fallback arrivals and turn ends go (None:
    nowhere; turn_end() then returns False). to_clock maps the
    caller's seconds (arrival_s given to route(), turn times) onto the
    services' clock, the scheduler's and the predictor's (identity: the
    caller already speaks it); a fallback route without arrival_s is
    reported at clock.now(), which must speak the services' clock (the
    default SystemClock does, as the services' own clocks)."""

    def __init__(self, scheduler: grpc.Channel | Sequence[grpc.Channel] | str, *,
                 nodes: Mapping[str, str] | None = None, predictor: grpc.Channel | None = None,
                 settings: ClientSettings = ClientSettings(), clock: Clock | None = None,
                 to_clock: Callable[[float], float] = lambda s: s, dial: Dial | None = None,
                 discovery: Discovery = Discovery()) -> None:
        """scheduler: its channel, one channel per replica, or a target list
        ("HOST:PORT,dns:NAME:PORT": the client dials each address with dial,
        plaintext by default, follows the dns: names as `discovery` says, and
        closes those channels on close()). InvalidArgument for a bad list."""
        self._settings = settings
        self._clock = clock or SystemClock()
        if isinstance(scheduler, str):
            self._replicas = ReplicaSet.of_targets(scheduler, settings.breaker, self._clock, dial, discovery)
        else:
            channels = list(scheduler) if isinstance(scheduler, (list, tuple)) else [scheduler]
            self._replicas = ReplicaSet.of_channels(channels, settings.breaker, self._clock)
        self._next_replica = 0
        self._strategy = FallbackStrategy(settings.fallback)
        self._nodes = KnownNodes(dict(nodes or {}))
        self._lock = threading.Lock()
        self._counters = ClientCounters()
        self._to_clock = to_clock
        self._arrivals: ArrivalReporter | None = None
        self._turn_ends: TurnEndReporter | None = None
        if predictor is not None:
            self._arrivals = ArrivalReporter(predictor, settings.reports, settings.report_timeout_s)
            self._turn_ends = TurnEndReporter(predictor, to_clock, settings.reports.batch_max,
                                              settings.reports.flush_s, settings.reports.capacity,
                                              settings.report_timeout_s)

    @property
    def breaker_state(self) -> BreakerState:
        """CLOSED while any replica's breaker is; else the first one's state (OPEN: no replica known)."""
        states = [replica.breaker.state for replica in self._replicas.members()]
        return BreakerState.CLOSED if BreakerState.CLOSED in states else (states[0] if states else BreakerState.OPEN)

    def replica_addresses(self) -> tuple[str, ...]:
        """The replicas asked now, by address (a target list's; "" for each channel given)."""
        return self._replicas.addresses()

    def route(self, request_id: str, block_hashes: Sequence[int], prompt_tokens: int, family: str = "",
              arrival_s: float = 0.0) -> Routed:
        """Where to run the request (module docstring). block_hashes: the
        chained hashes of the prompt's full blocks; family: empty for the
        scheduler's default (the first block hash); arrival_s: 0 for now."""
        hashes = list(block_hashes)
        request = self._request(request_id, hashes, prompt_tokens, family, arrival_s)
        if request is not None:
            reply = self._ask_replicas(request)
            if reply is not None:
                return self._placed(request_id, prompt_tokens, Routed(
                    reply.node_id, reply.address, RouteSource.SCHEDULER, reply.family or family, reply))
        return self._fallback(request_id, hashes, prompt_tokens, family or default_family(hashes), arrival_s)

    def done(self, request_id: str) -> None:
        """The request finished, failed or moved away: its load leaves its node."""
        self._nodes.closed(request_id)

    def moved(self, request_id: str, node: str, prompt_tokens: int) -> None:
        """The router ran the request on another node than routed (its engine had failed): its load moves."""
        self._nodes.opened(request_id, node, prompt_tokens)

    def turn_end(self, conversation: str, arrival_s: float, end_s: float, prompt_tokens: int, output_tokens: int,
                 follow_ups: int = 0) -> bool:
        """Queues a turn end for the predictor; never blocks. False: dropped (or no predictor)."""
        if self._turn_ends is None:
            return False
        return self._turn_ends.offer(conversation, arrival_s, end_s, prompt_tokens, output_tokens, follow_ups)

    def mark_down(self, node: str) -> None:
        """The router saw the node fail: the fallback avoids it until mark_up or the scheduler names it."""
        self._nodes.mark_down(node)

    def mark_up(self, node: str) -> None:
        self._nodes.mark_up(node)

    def add_node(self, node: str, address: str) -> None:
        self._nodes.learn(node, address)

    def counters(self) -> ClientCounters:
        with self._lock:
            c = self._counters
            return ClientCounters(c.routes, c.routes_scheduler, c.routes_fallback, c.scheduler_errors,
                                  dict(c.errors_by_code), self._replicas.breaker_opens(),
                                  self.breaker_state.value, c.routes_retried,
                                  self._arrivals.stats() if self._arrivals else None,
                                  self._turn_ends.stats() if self._turn_ends else None)

    def close(self, timeout_s: float = 10.0) -> None:
        """Sends the queued reports, then stops their threads; closes the channels the client dialled
        from a target list (the channels given stay the caller's)."""
        for reporter in (self._arrivals, self._turn_ends):
            if reporter is not None:
                reporter.close(timeout_s)
        self._replicas.close()

    def _request(self, request_id: str, hashes: list[int], prompt_tokens: int, family: str,
                 arrival_s: float) -> scheduler_pb2.RouteRequest | None:
        """The RouteRequest, or None (counted as INVALID_REQUEST, never sent) when a field does not fit its
        proto type (a hash outside uint64, a negative token count): that request falls back."""
        try:
            return scheduler_pb2.RouteRequest(request_id=request_id, block_hashes=hashes, prompt_tokens=prompt_tokens,
                                              family=family,
                                              arrival_time_s=self._to_clock(arrival_s) if arrival_s else 0.0)
        except (ValueError, TypeError):
            with self._lock:
                self._counters.errors_by_code["INVALID_REQUEST"] = self._counters.errors_by_code.get(
                    "INVALID_REQUEST", 0) + 1
            return None

    def _ask_replicas(self, request: scheduler_pb2.RouteRequest) -> scheduler_pb2.RouteResponse | None:
        """The first answer of the replicas, starting at the next in turn (module docstring)."""
        replicas = self._replicas.members()  # one snapshot: discovery may replace the set meanwhile
        if not replicas:
            return None
        with self._lock:
            first = self._next_replica % len(replicas)
            self._next_replica = first + 1
        failed = False
        for k in range(len(replicas)):
            replica = replicas[(first + k) % len(replicas)]
            if not replica.breaker.allow():
                continue
            reply, fault = self._ask(replica, request)
            if reply is not None:
                if failed:
                    with self._lock:
                        self._counters.routes_retried += 1
                return reply
            if not fault:
                return None  # the request's own fault (or no node named): another replica would say the same
            failed = True
        return None

    def _ask(self, replica: Replica, request: scheduler_pb2.RouteRequest
             ) -> tuple[scheduler_pb2.RouteResponse | None, bool]:
        """(the answer or None, whether the failure was the scheduler's fault)."""
        try:
            reply = replica.stub.Route(request, timeout=self._settings.deadline_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            with self._lock:
                self._counters.scheduler_errors += 1
                self._counters.errors_by_code[code.name] = self._counters.errors_by_code.get(code.name, 0) + 1
            if code in SCHEDULER_FAULTS:
                replica.breaker.record_failure()
                return None, True
            replica.breaker.record_success()
            return None, False
        replica.breaker.record_success()
        if not reply.node_id:  # an answer that names no node is no answer
            return None, False
        self._nodes.learn(reply.node_id, reply.address)
        return reply, False

    def _fallback(self, request_id: str, hashes: list[int], prompt_tokens: int, family: str,
                  arrival_s: float) -> Routed:
        node = self._strategy.choose(hashes, prompt_tokens, self._nodes.snapshot())
        if node is None:
            raise Unavailable("the scheduler did not answer and the client knows no node that is up")
        routed = self._placed(request_id, prompt_tokens, Routed(node, self._nodes.address(node),
                                                                RouteSource.FALLBACK, family))
        if self._arrivals is not None:
            # the clock speaks the services' time already; a given arrival_s is the caller's
            self._arrivals.offer(self._to_clock(arrival_s) if arrival_s else self._clock.now(), family, node,
                                 prompt_tokens)
        return routed

    def _placed(self, request_id: str, prompt_tokens: int, routed: Routed) -> Routed:
        self._nodes.opened(request_id, routed.node_id, prompt_tokens)
        with self._lock:
            self._counters.routes += 1
            if routed.source is RouteSource.SCHEDULER:
                self._counters.routes_scheduler += 1
            else:
                self._counters.routes_fallback += 1
        return routed
