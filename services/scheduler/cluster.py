"""The nodes the scheduler knows: address, capacity, geometry, load and liveness.

Invariants:
- A node is *alive* iff its last heartbeat (registration counts as one) is at
  most `node_timeout_s` seconds old on the injected clock. Liveness is a pure
  function of the clock, so a node that stops heartbeating stops receiving
  routes and orders at once, even between sweeps; `sweep()` only records the
  UP -> DOWN transition (for logs and metrics).
- A heartbeat from a known node that is not DOWN revives it; one from an
  unknown node, or from a node declared DOWN (by `sweep` or `mark_down`), is
  answered `known=False` so the node registers again: a node that comes back
  is a new incarnation (a new generation) and its holdings are rebuilt from
  its event stream, never carried over from before it went down.
- Re-registering replaces the address and geometry, clears the load, and bumps
  `generation`; whoever tracks per-registration state (block inventory, event
  streams) compares generations to drop stale work.
- `pending_tokens` / `pending_requests` / `pending_ms` count work routed to a
  node since its last *queue report* (a heartbeat carrying queue figures), so
  a burst between two reports is not piled on one node. The next queue report
  includes that work, so it resets them.
- Drain rule (`pending_stale_s`): routed work that no queue report has counted
  for pending_stale_s is worked off at one ms of prefill per ms of clock time
  (tokens and requests in proportion, rounded up), credited at each heartbeat
  up to that heartbeat's time; heartbeats prove the node alive, so a node that
  stopped beating keeps its work. A node whose queue is reported more often
  than every pending_stale_s never drains (the simulator's nodes report on
  every beat), so its figures are exactly the reported ones plus what was
  routed since.
- `least_loaded(k)` answers from a LoadBoard keyed by `queue_ms(node)` (the
  expected queueing delay the router scores, ms), kept current on every
  register, heartbeat and routed request: pending work changes only there
  (a drain is applied by a heartbeat), so the board never lags it.
- All nodes share one block size: block hashes are chained over block_size
  tokens, so nodes with different block sizes could never share a block.

Not thread-safe: SchedulerCore serialises access. Times are clock seconds.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable

from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.load_board import LoadBoard

QueueCost = Callable[[int, int], float]  # (queued tokens, waiting requests) -> ms


class NodeStatus(enum.Enum):
    UP = "up"
    DOWN = "down"  # declared down: must register again to come back
    RESTORED = "restored"  # known from saved state; alive, and UP, at its next heartbeat


@dataclass(slots=True)
class NodeLoad:
    """Load as last reported by the node's heartbeat."""

    queued_tokens: int = 0  # prefill tokens waiting
    running_tokens: int = 0  # tokens in running sequences
    free_pages: int = 0
    running_requests: int = 0
    waiting_requests: int = 0
    queued_prefill_ms: float | None = None  # the engine's own queue estimate; None: not reported
    retained_blocks: int | None = None  # blocks its last tier holds under retain orders; None: not reported


@dataclass(frozen=True, slots=True)
class LoadReport:
    """The figures one heartbeat carries; None = not in this report. Nodes
    have two reporters that each know half of the load (the kvstore its free
    pages, the engine its queue), so a report updates only what it carries
    and the rest stays as last reported."""

    queued_tokens: int | None = None
    running_tokens: int | None = None
    free_pages: int | None = None
    running_requests: int | None = None
    waiting_requests: int | None = None
    queued_prefill_ms: float | None = None
    retained_blocks: int | None = None

    def __post_init__(self) -> None:
        ms = self.queued_prefill_ms
        if ms is not None and not (math.isfinite(ms) and ms >= 0.0):
            raise InvalidArgument(f"queued_prefill_ms={ms}: must be a finite number of ms >= 0")
        if self.retained_blocks is not None and self.retained_blocks < 0:
            raise InvalidArgument(f"retained_blocks={self.retained_blocks}: must be >= 0")

    @classmethod
    def full(cls, load: NodeLoad) -> "LoadReport":
        """A report carrying every figure (replaces the whole load)."""
        return cls(load.queued_tokens, load.running_tokens, load.free_pages, load.running_requests,
                   load.waiting_requests, load.queued_prefill_ms, load.retained_blocks)

    @property
    def carries_queue(self) -> bool:
        return (self.queued_tokens is not None or self.waiting_requests is not None
                or self.queued_prefill_ms is not None)

    def merged_into(self, load: NodeLoad) -> NodeLoad:
        return NodeLoad(
            load.queued_tokens if self.queued_tokens is None else self.queued_tokens,
            load.running_tokens if self.running_tokens is None else self.running_tokens,
            load.free_pages if self.free_pages is None else self.free_pages,
            load.running_requests if self.running_requests is None else self.running_requests,
            load.waiting_requests if self.waiting_requests is None else self.waiting_requests,
            load.queued_prefill_ms if self.queued_prefill_ms is None else self.queued_prefill_ms,
            load.retained_blocks if self.retained_blocks is None else self.retained_blocks)


@dataclass(slots=True)
class Node:
    node_id: NodeId
    address: str
    sizes: NodeSizes  # its tiers' pages and retention cap, as registered
    geometry: KVGeometry
    registered_at: float
    last_heartbeat: float
    generation: int
    load: NodeLoad = field(default_factory=NodeLoad)
    status: NodeStatus = NodeStatus.UP
    pending_tokens: int = 0
    pending_requests: int = 0
    pending_ms: float = 0.0  # prefill ms of the work routed here since the last queue report
    queue_reported_at: float = 0.0  # clock s of the last queue report (registration counts as one)
    drained_to: float = 0.0  # clock s up to which the pending work has been worked off (Cluster._drain)
    routed_tokens: int = 0  # pending_tokens / requests / ms just after the last add_pending:
    routed_requests: int = 0  # what a drain scales tokens and requests from, so repeated
    routed_ms: float = 0.0  # drains do not compound their rounding
    routes_total: int = 0
    bytes_per_block: int = 0  # geometry.bytes_per_block, cached: the router reads it per candidate
    retained_reported_at: float | None = None  # clock s of the heartbeat that last reported load.retained_blocks
    # Cluster.queue_ms(self) as of the last change to its inputs (heartbeat, route, loss), kept
    # by Cluster where it updates the load board: the router reads it per candidate of every route.
    queue_ms_now: float = 0.0
    # Clock s at which requests routed here join its engine's queue, for those that wait for a promotion
    # or pull first (routed later, a request without one enters ahead of them): Cluster.entering_ms.
    entering: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bytes_per_block = self.geometry.bytes_per_block

    @property
    def queued_tokens(self) -> int:
        """Reported queue plus what was routed here since the last heartbeat."""
        return self.load.queued_tokens + self.pending_tokens

    @property
    def waiting_requests(self) -> int:
        return self.load.waiting_requests + self.pending_requests


class Cluster:
    def __init__(self, node_timeout_s: float, queue_cost: QueueCost | None = None,
                 pending_stale_s: float = math.inf) -> None:
        """pending_stale_s: routed work no queue report has counted for this
        long (s) starts draining (module docstring); inf: never drains."""
        if node_timeout_s <= 0:
            raise InvalidArgument(f"node_timeout_s={node_timeout_s}: must be > 0")
        if not pending_stale_s > 0:
            raise InvalidArgument(f"pending_stale_s={pending_stale_s}: must be > 0")
        self._timeout_s = node_timeout_s
        self._stale_s = pending_stale_s
        self._nodes: dict[NodeId, Node] = {}
        self._generations = 0
        self._queue_cost: QueueCost = queue_cost or (lambda tokens, waiting: float(tokens))
        self._board = LoadBoard()
        self.routes_total = 0  # requests routed to any node, ever (add_pending)

    @property
    def node_timeout_s(self) -> float:
        return self._timeout_s

    def register(self, node_id: NodeId, address: str, sizes: NodeSizes, geometry: KVGeometry,
                 now: float) -> tuple[Node, bool]:
        """Adds or replaces a node; returns it and whether it was known.
        Its sizes: a device tier of > 0 pages, a host tier of >= 0 (0: none),
        and a retention cap within its last tier (None: not reported); the
        errors name the RegisterNode fields they came from."""
        capacity_pages, host_pages, retain_max_blocks = sizes.device_pages, sizes.host_pages, sizes.retain_max_blocks
        if not node_id:
            raise InvalidArgument("node_id is empty")
        if not address or ":" not in address:
            raise InvalidArgument(f"address={address!r}: expected host:port")
        if capacity_pages <= 0:
            raise InvalidArgument(f"capacity_pages={capacity_pages}: must be > 0")
        if host_pages < 0:
            raise InvalidArgument(f"host_pages={host_pages}: must be >= 0 (0: no host tier)")
        if retain_max_blocks is not None and not 0 <= retain_max_blocks <= (host_pages or capacity_pages):
            raise InvalidArgument(f"retain_max_blocks={retain_max_blocks}: must be in [0, "
                                  f"{host_pages or capacity_pages}], the pages of its last tier")
        self._check_block_size(node_id, geometry.block_size)
        self._generations += 1
        previous = self._nodes.get(node_id)
        node = Node(node_id, address, sizes, geometry, registered_at=now,
                    last_heartbeat=now, generation=self._generations,
                    load=NodeLoad(free_pages=capacity_pages), queue_reported_at=now, drained_to=now,
                    routes_total=previous.routes_total if previous else 0)
        self._nodes[node_id] = node
        self._board.upsert(node_id, 0.0, now)
        return node, previous is not None

    def heartbeat(self, node_id: NodeId, load: NodeLoad | LoadReport, now: float) -> bool:
        """Merges the figures the report carries (a NodeLoad carries all of
        them); False when the node is unknown (it must register). Work routed
        since the last report is forgotten only by a report with queue
        figures, which counts it; a report without them (a kvstore's free
        pages) leaves it, less what the drain rule has worked off by now."""
        if not node_id:
            raise InvalidArgument("node_id is empty")
        node = self._nodes.get(node_id)
        if node is None or node.status is NodeStatus.DOWN:
            return False
        if isinstance(load, NodeLoad):  # a full report replaces every figure (the simulator's every beat)
            node.load = NodeLoad(load.queued_tokens, load.running_tokens, load.free_pages, load.running_requests,
                                 load.waiting_requests, load.queued_prefill_ms, load.retained_blocks)
            carries_queue = True
        else:
            node.load = load.merged_into(node.load)
            carries_queue = load.carries_queue
        if load.retained_blocks is not None:
            node.retained_reported_at = now
        elif isinstance(load, NodeLoad):  # a full report without the count: it is not known
            node.retained_reported_at = None
        node.last_heartbeat = max(node.last_heartbeat, now)
        node.status = NodeStatus.UP
        if carries_queue:
            node.pending_tokens = node.routed_tokens = 0
            node.pending_requests = node.routed_requests = 0
            node.pending_ms = node.routed_ms = 0.0
            node.queue_reported_at = node.drained_to = max(node.queue_reported_at, now)
        else:
            self._drain(node, now)
        node.queue_ms_now = self.queue_ms(node)
        self._board.upsert(node_id, node.queue_ms_now, node.last_heartbeat)
        return True

    def get(self, node_id: NodeId) -> Node:
        if not node_id:
            raise InvalidArgument("node_id is empty")
        node = self._nodes.get(node_id)
        if node is None:
            raise NotFound(f"node {node_id!r} is not registered")
        return node

    def find(self, node_id: NodeId) -> Node | None:
        return self._nodes.get(node_id)

    def is_alive(self, node: Node, now: float) -> bool:
        return now - node.last_heartbeat <= self._timeout_s

    def live_among(self, node_ids: Iterable[NodeId], now: float) -> list[Node]:
        """The registered, alive nodes among node_ids, in their order (is_alive
        inlined: the router asks this for every holder of every request)."""
        nodes, timeout_s = self._nodes, self._timeout_s
        out = []
        for node_id in node_ids:
            node = nodes.get(node_id)
            if node is not None and now - node.last_heartbeat <= timeout_s:
                out.append(node)
        return out

    def nodes(self) -> list[Node]:
        return sorted(self._nodes.values(), key=lambda n: n.node_id)

    def live_nodes(self, now: float) -> list[Node]:
        return [n for n in self.nodes() if self.is_alive(n, now)]

    def mark_down(self, node_id: NodeId) -> bool:
        """Declares a node DOWN at once (its process was seen to die: a
        failed data-plane write, a closed event stream, an operator's
        removal): no route or order reaches it from now on, and it must
        register again to come back. False when unknown or already DOWN."""
        node = self._nodes.get(node_id)
        if node is None or node.status is NodeStatus.DOWN:
            return False
        node.status = NodeStatus.DOWN
        node.last_heartbeat = -math.inf
        node.queue_ms_now = self.queue_ms(node)
        self._board.upsert(node_id, node.queue_ms_now, -math.inf)  # parked at the board's next query
        return True

    def sweep(self, now: float) -> list[NodeId]:
        """Marks timed-out nodes DOWN; returns those that just went down."""
        went_down = []
        for node in self._nodes.values():
            if node.status is NodeStatus.UP and not self.is_alive(node, now):
                node.status = NodeStatus.DOWN
                went_down.append(node.node_id)
        return sorted(went_down)

    def add_pending(self, node_id: NodeId, tokens: int, prefill_ms: float = 0.0,
                    now: float | None = None, enters_in_ms: float = 0.0) -> None:
        """Work routed to node_id at clock time now (None: its last
        heartbeat's) before its next queue report: tokens to prefill and their
        expected prefill time (ms); enters_in_ms > 0: it joins the engine's
        queue only that long after now (a promotion or pull first)."""
        node = self._nodes[node_id]
        at = node.last_heartbeat if now is None else now
        if enters_in_ms > 0:
            node.entering.append(at + enters_in_ms / 1000.0)
        start = max(node.drained_to, node.queue_reported_at + self._stale_s)
        if (at - start) * 1000.0 >= node.pending_ms:
            # What was pending would be worked off by `at` (if a later
            # heartbeat shows the node alive): move the drain's origin so that
            # crediting from it pays for the old work first and for the new
            # work only from `at`, not from before it arrived.
            node.drained_to = at - node.pending_ms / 1000.0
        node.pending_tokens += tokens
        node.pending_ms += prefill_ms
        node.pending_requests += 1
        node.routed_tokens, node.routed_requests, node.routed_ms = (
            node.pending_tokens, node.pending_requests, node.pending_ms)
        node.routes_total += 1
        self.routes_total += 1
        node.queue_ms_now = self.queue_ms(node)
        self._board.set_load(node_id, node.queue_ms_now)

    @staticmethod
    def entering_ms(node: Node, now: float) -> tuple[float, ...]:
        """How long (ms from now) until each request routed to node that is
        still waiting for its promotion or pull joins its engine's queue
        (those that joined are forgotten here)."""
        waiting = [at for at in node.entering if at > now]
        node.entering = waiting
        return tuple((at - now) * 1000.0 for at in waiting)

    def _drain(self, node: Node, now: float) -> None:
        """Works off the node's pending work at one ms of prefill per ms of
        clock time over the time, up to now, that is past both drained_to and
        pending_stale_s after its last queue report; tokens and requests keep
        their share of routed_* (rounded up: work left means a request left).
        Work of no prefill time is worked off by any creditable time."""
        start = max(node.drained_to, node.queue_reported_at + self._stale_s)
        if not now > start:
            return
        node.drained_to = now
        left = node.pending_ms - (now - start) * 1000.0
        if left <= 0.0:
            node.pending_tokens = node.pending_requests = 0
            node.pending_ms = 0.0
            return
        node.pending_ms = left  # > 0, and routed_ms >= pending_ms: drains only lower it
        node.pending_tokens = math.ceil(node.routed_tokens * left / node.routed_ms)
        node.pending_requests = math.ceil(node.routed_requests * left / node.routed_ms)

    def queue_ms(self, node: Node) -> float:
        """Expected queueing delay of node, ms (reported plus routed-since load):
        the engine's own estimate when it reports one, else linear in queued
        tokens and waiting requests (the profile's queue_ms)."""
        reported = node.load.queued_prefill_ms
        if reported is not None:
            return reported + node.pending_ms
        return self._queue_cost(node.queued_tokens, node.waiting_requests)

    def least_loaded(self, k: int, now: float, exclude: Collection[NodeId] = (),
                     counted: Collection[NodeId] | None = None) -> list[NodeId]:
        """Live nodes outside exclude, least expected queueing first, up to the
        k-th one in counted (default: the k least queued); see LoadBoard."""
        return self._board.least_loaded(k, now, self._timeout_s, exclude, counted)

    def num_nodes(self) -> int:
        """Registered nodes, alive or not."""
        return len(self._nodes)

    def block_size(self) -> int | None:
        """The cluster's block size, or None while no node is registered."""
        for node in self._nodes.values():
            return node.geometry.block_size
        return None

    def _check_block_size(self, node_id: NodeId, block_size: int) -> None:
        for other in self._nodes.values():
            if other.node_id != node_id and other.geometry.block_size != block_size:
                raise FailedPrecondition(
                    f"geometry.block_size={block_size} differs from node {other.node_id!r} "
                    f"({other.geometry.block_size}); all nodes must share one block size")
