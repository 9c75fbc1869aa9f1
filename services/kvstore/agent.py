"""The node's link to the scheduler, one replica or several (gRPC; not core).

- one SchedulerLink per scheduler address (scheduler_link.py): each
  registers, heartbeats and watches WatchOrders with its replica. A
  `dns:NAME:PORT` entry of --scheduler (common/discovery.py) is every
  address NAME resolves to, re-resolved every few seconds: a link is added
  for each address that appears and closed once its address has been gone
  for the grace period (common/discovery_watch.py). The links are a tuple
  replaced whole under a lock, so the report and registry paths read a
  consistent snapshot without locking;
- every order, from whichever link, passes the OrderFence (order_fence.py):
  an older epoch than the newest seen (a deposed leader's) or an id already
  run (a new leader re-sending what it adopted) is dropped unreported;
- an admitted order runs on a small pool: report IN_FLIGHT, replicate to
  order.target_address (or promote, retain, or stage from disk), report COMMITTED or FAILED
  with the message, bytes and blocks. A report goes first to the replica
  that last said it leads, then to the one that sent the order, then to each
  other in turn while one refuses it (gone: UNAVAILABLE; no longer leading:
  FAILED_PRECONDITION): after a failover the new leader, which adopted the
  order from the shared state, takes it;
- stop() ends every loop at once (the order streams are cancelled) and does
  not wait for orders in flight (their calls carry deadlines).

free_pages in heartbeats is what a replica could get without touching pinned
or reserved blocks: free plus evictable pages. A full pool of cold cache is
room for the planner, not a full node.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import grpc

from speckv.services.common.discovery import Changes, parse_targets
from speckv.services.common.discovery_watch import GRACE_S, INTERVAL_S, Resolve, TargetWatcher, resolve_dns
from speckv.services.common.errors import NOT_LEADING, SpeckvError, Unavailable
from speckv.services.common.rpc.telemetry import Telemetry
from speckv.services.common.rpc.tls import TlsMaterial
from speckv.services.kvstore.order_fence import Admission, OrderFence
from speckv.services.kvstore.replication import ReplicationResult, Replicator, TransferOutcome
from speckv.services.kvstore.scheduler_link import Backoff, SchedulerLink, describe
from speckv.services.kvstore.servicer import order_from_proto
from speckv.services.kvstore.store import KVStoreCore
from speckv.v1 import common_pb2, scheduler_pb2

log = logging.getLogger(__name__)
ORDER_WORKERS = 2
# How long an order's report is retried while no replica takes it (a failover elects a new leader within two
# leases, 4 s at the default): past this it is logged and dropped (the order expires at the scheduler).
REPORT_RETRY_S = 10.0


def scheduler_addresses(spec: str | Sequence[str]) -> list[str]:
    """--scheduler's static replicas: a comma-separated list (or a list), in order, without blanks or repeats
    (dns: entries are not addresses: SchedulerAgent resolves them)."""
    return list(parse_targets(spec, "scheduler").static)


class SchedulerAgent:
    def __init__(self, store: KVStoreCore, replicator: Replicator, scheduler_address: str | Sequence[str],
                 advertise_address: str, telemetry: Telemetry | None, *, heartbeat_interval_s: float = 1.0,
                 timeout_s: float = 10.0, tls: TlsMaterial | None = None, discovery_interval_s: float = INTERVAL_S,
                 discovery_grace_s: float = GRACE_S, resolve: Resolve = resolve_dns) -> None:
        self._store = store
        self._replicator = replicator
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._cancelled = CancelledOrders()
        self.fence = OrderFence()
        self._runs = RunLedger()
        self._orders = ThreadPoolExecutor(ORDER_WORKERS, thread_name_prefix=f"{store.node_id}-order")
        targets = parse_targets(scheduler_address, "scheduler")
        if targets.empty:
            raise ValueError("no scheduler address")
        self._link_args = (advertise_address, telemetry, heartbeat_interval_s, tls)
        self._links_lock = threading.Lock()  # held by writers only; readers take self._links as it is
        self._watcher = TargetWatcher(targets, self._replicas_changed, name=f"{store.node_id}-discovery",
                                      interval_s=discovery_interval_s, grace_s=discovery_grace_s, resolve=resolve)
        self._links: tuple[SchedulerLink, ...] = tuple(self._link(a) for a in self._watcher.initial())

    def _link(self, address: str) -> SchedulerLink:
        advertise, telemetry, heartbeat_interval_s, tls = self._link_args
        return SchedulerLink(self._store, address, advertise, telemetry, self._received, self.fence.saw_epoch,
                             heartbeat_interval_s=heartbeat_interval_s, timeout_s=self._timeout_s, tls=tls)

    def scheduler_links(self) -> tuple[SchedulerLink, ...]:
        """The links now, one per known replica (a snapshot)."""
        return self._links

    @property
    def registrations(self) -> int:
        """Successful RegisterNode calls, all replicas together (for tests and logs)."""
        return sum(link.registrations for link in self._links)

    def order_counters(self) -> dict[str, int]:
        """StatsResponse.order_counters (kvstore.proto says each)."""
        return {"run": self._runs.total, "run_twice": self._runs.twice,
                "refused_stale": self.fence.refused[Admission.STALE],
                "refused_duplicate": self.fence.refused[Admission.DUPLICATE],
                "newest_epoch": self.fence.newest_epoch}

    def start(self) -> "SchedulerAgent":
        for link in self._links:
            link.start()
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._watcher.stop()  # no link is added or closed after this
        with self._links_lock:
            links = self._links
        for link in links:
            link.close()
        self._orders.shutdown(wait=False, cancel_futures=True)
        for link in links:
            link.join()

    def _replicas_changed(self, changes: Changes) -> None:
        """On the discovery thread: links for the replicas that appeared, the gone ones' closed."""
        with self._links_lock:
            if self._stop.is_set():
                return
            gone = [link for link in self._links if link.address in changes.removed]
            new = [self._link(address) for address in changes.added]
            self._links = tuple(link for link in self._links if link not in gone) + tuple(new)
            for link in new:
                link.start()
        for link in gone:
            log.info("scheduler replica %s is gone from DNS: link closed", link.address)
            link.close()
            link.join()

    def registered_nodes(self) -> dict[str, str]:
        """The scheduler's registry, node id -> registered address (peers.py
        caches it), from the first replica that answers; Unavailable when
        none can be asked."""
        links = self._links
        failures = [] if links else ["no scheduler replica known yet (its dns: name resolved to none)"]
        for link in links:
            try:
                state = link.stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=self._timeout_s)
            except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed by stop()
                failures.append(f"{link.address}: {describe(exc)}")
                continue
            return {node.node_id: node.address for node in state.nodes}
        raise Unavailable(f"scheduler registry: {'; '.join(failures)}")

    # ---- orders ----------------------------------------------------------
    def _received(self, link: SchedulerLink, order: common_pb2.ReplicationOrder) -> None:
        if order.cancelled:
            self._cancelled.mark(order.order_id)
            return
        verdict = self.fence.admit(order.order_id, order.epoch)
        if verdict is Admission.RUN:
            self._orders.submit(self._execute, link, order)
        elif verdict is Admission.STALE:
            log.warning("order %s from %s refused: epoch %d is older than %d (a deposed scheduler leader)",
                        order.order_id, link.address, order.epoch, self.fence.newest_epoch)
        else:
            log.info("order %s from %s already run here; not run again", order.order_id, link.address)

    def _execute(self, link: SchedulerLink, order: common_pb2.ReplicationOrder) -> None:
        # An order cancelled while it waited for a worker is dropped unreported:
        # the scheduler already counts it cancelled. One already sending runs on.
        if self._stop.is_set() or self._cancelled.contains(order.order_id):
            return
        if order.action not in ("", "replicate", "redundant", "prefetch", "retain", "stage"):
            # A newer scheduler's action this node cannot run: refuse it rather than copy.
            self._report(link, order.order_id, common_pb2.ORDER_STATE_FAILED,
                         f"unknown order action {order.action!r}")
            return
        self._runs.ran(order.order_id)
        self._report(link, order.order_id, common_pb2.ORDER_STATE_IN_FLIGHT, "")
        try:
            result = (self._prefetch(order) if order.action == "prefetch"
                      else self._retain(order) if order.action == "retain"
                      else self._stage(order) if order.action == "stage"
                      # "replicate" and "redundant" copy alike: they differ only in why the planner chose them.
                      else self._replicator.replicate(order_from_proto(order)))
        except SpeckvError as exc:
            result = ReplicationResult(order.order_id, TransferOutcome.FAILED, message=str(exc), error=exc)
        except Exception as exc:  # noqa: BLE001 - a bug must still fail the order, not hang it
            log.exception("order %s crashed", order.order_id)
            result = ReplicationResult(order.order_id, TransferOutcome.FAILED, message=f"internal error: {exc}")
        state = (common_pb2.ORDER_STATE_COMMITTED if result.outcome is TransferOutcome.COMMITTED
                 else common_pb2.ORDER_STATE_FAILED)
        self._report(link, order.order_id, state, result.message, result.bytes_sent, result.blocks_sent,
                     result.transport)

    def _prefetch(self, order: common_pb2.ReplicationOrder) -> ReplicationResult:
        """Promotes this node's host-only blocks of the order's prefix (the
        blocks never cross the network: bytes_sent stays 0)."""
        promoted = self._store.promote(list(order.block_hashes))
        return ReplicationResult(order.order_id, TransferOutcome.COMMITTED, blocks_sent=promoted,
                                 message=f"prefetched {promoted} blocks into the device tier")

    def _stage(self, order: common_pb2.ReplicationOrder) -> ReplicationResult:
        """Reads this node's disk-only blocks of the order's prefix into its host tier (issue 44)."""
        staged = self._store.stage(list(order.block_hashes))
        return ReplicationResult(order.order_id, TransferOutcome.COMMITTED, blocks_sent=staged,
                                 message=f"staged {staged} blocks from the disk into the host tier")

    def _retain(self, order: common_pb2.ReplicationOrder) -> ReplicationResult:
        """Keeps the order's prefix on this node for its lease (nothing moves)."""
        retained = self._store.retain(list(order.block_hashes), order.lease_ms / 1e3)
        return ReplicationResult(order.order_id, TransferOutcome.COMMITTED, blocks_sent=retained,
                                 message=f"retained {retained} blocks for {order.lease_ms} ms")

    def _report(self, via: SchedulerLink, order_id: str, state: int, message: str, bytes_sent: int = 0,
                blocks_sent: int = 0, transport: str = "") -> None:
        """transport: the data plane that carried the order (shm, nixl, tcp, grpc; "" if none did). Tried at
        the leading replica, the sending one, then the others (module docstring); a report no replica takes is logged."""
        report = scheduler_pb2.OrderStatusReport(order_id=order_id, state=state, message=message[:2000],
                                                 bytes_sent=bytes_sent, blocks_sent=blocks_sent,
                                                 transport=transport)
        deadline = time.monotonic() + REPORT_RETRY_S
        backoff = Backoff()
        while True:
            failures, leaderless = self._report_once(via, report)
            if not failures:
                return
            if not leaderless:
                break  # a leading replica refused the report itself: asking again would not change that
            if self._stop.is_set() or time.monotonic() >= deadline:
                break
            # No replica took it: a failover under way (no leader yet) or the scheduler restarting.
            self._stop.wait(backoff.next())
        log.warning("could not report order %s: %s", order_id, "; ".join(failures))

    def _report_once(self, via: SchedulerLink, report: scheduler_pb2.OrderStatusReport) -> tuple[list[str], bool]:
        """Tries each replica in turn: (the failures, [] when one took it; whether every failure was a replica
        gone or not leading, i.e. no leader answered and a later try may find one)."""
        links = self._links
        if not links:
            return ["no scheduler replica known yet (its dns: name resolved to none)"], True
        failures: list[str] = []
        leaderless = True
        # The replica that says it leads first (after a failover, the one that adopted the order), then the
        # sender, then the rest.
        order = sorted(links, key=lambda link: (not link.is_leader, link is not via))
        for link in order:
            try:
                link.stub.ReportOrderStatus(report, timeout=self._timeout_s)
                return [], False
            except (grpc.RpcError, ValueError) as exc:
                failures.append(f"{link.address}: {describe(exc)}")
                leaderless = leaderless and _no_leader_answered(exc)
                if self._stop.is_set():
                    break
        return failures, leaderless


def _no_leader_answered(exc: Exception) -> bool:
    """The replica is gone (or the channel closed), or said it does not lead."""
    code = exc.code() if isinstance(exc, grpc.RpcError) and hasattr(exc, "code") else None
    if code is None or code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return True
    details = exc.details() if hasattr(exc, "details") else ""
    return code is grpc.StatusCode.FAILED_PRECONDITION and NOT_LEADING in (details or "")


class CancelledOrders:
    """The ids of the last `capacity` orders the scheduler cancelled."""

    def __init__(self, capacity: int = 4096) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def mark(self, order_id: str) -> None:
        with self._lock:
            self._ids[order_id] = None
            self._ids.move_to_end(order_id)
            while len(self._ids) > self._capacity:
                self._ids.popitem(last=False)

    def contains(self, order_id: str) -> bool:
        with self._lock:
            return order_id in self._ids


class RunLedger:
    """How many orders this node executed, and how many ids it executed more
    than once among the last `capacity` (counted where orders run, apart
    from the fence that should make it 0: the check of that fence)."""

    def __init__(self, capacity: int = 16_384) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()
        self.total = 0
        self.twice = 0

    def ran(self, order_id: str) -> None:
        with self._lock:
            self.total += 1
            if order_id in self._ids:
                self.twice += 1
                self._ids.move_to_end(order_id)
                return
            self._ids[order_id] = None
            while len(self._ids) > self._capacity:
                self._ids.popitem(last=False)
