"""Chaos area `faults`: a full pool, a slow (stopped) peer, a partitioned
node, kill -9 of each service mid-traffic, and the scheduler killed and
restarted on its --state-dir under replay. Services the suite kills it
starts again on the same port, so the run ends with the whole cluster up."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from speckv.loadgen.bench.chaos.common import TIMEOUT, cluster_state, intact, nodes, order, put, stats, wait_until
from speckv.loadgen.bench.chaos.report import SERVER_FAULTS, Verdict, code_of, expect_code
from speckv.v1 import common_pb2, kvstore_pb2, predictor_pb2, scheduler_pb2

if TYPE_CHECKING:
    from speckv.loadgen.bench.chaos.cli import Context

AREA = "faults"
DETECT_SLACK_S = 6.0  # beyond node_timeout_s: ticks, a loaded machine; a deadline, not a measurement
COME_BACK_S = 40.0  # a restarted or healed service is serving and alive again within this


@dataclass(slots=True)
class Traffic:
    """Route calls in a loop on a thread, as a router would send them:
    records when each was sent and answered, and where it went.

    Judge a route by its send time: a Route the server decided just before
    it marked a node down can reach the client after a concurrent ListNodes
    that already saw the node down, so only routes sent after the client
    saw the mark are owed a different node."""

    cluster: object
    retries: bool = False  # the reference router retries UNAVAILABLE until its request's deadline
    answered: list[tuple[float, float, str]] = field(default_factory=list)  # (sent, answered, node id); monotonic s
    codes: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "Traffic":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)

    def faults(self) -> int:
        return sum(n for c, n in self.codes.items() if c in {f.name for f in SERVER_FAULTS})

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            request = scheduler_pb2.RouteRequest(request_id=f"t-{i}", block_hashes=[9_000_000 + i % 50, 9_100_000 + i],
                                                 prompt_tokens=32, family=f"fam-{i % 7}")
            deadline = time.monotonic() + (30.0 if self.retries else 0.0)
            while True:
                code, _ = code_of(lambda: self._route(request))
                self.codes[code.name] = self.codes.get(code.name, 0) + 1
                if code == grpc.StatusCode.OK or not self.retries or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            if code != grpc.StatusCode.OK:
                self.lost += 1
            time.sleep(0.01)

    def _route(self, request: scheduler_pb2.RouteRequest) -> None:
        sent_at = time.monotonic()
        reply = self.cluster.scheduler().Route(request, timeout=2.0)  # type: ignore[attr-defined]
        self.answered.append((sent_at, time.monotonic(), reply.node_id))


def run(ctx: "Context") -> None:
    _full_pool(ctx)
    _slow_peer(ctx)
    _partition(ctx)
    _kill_kvstore(ctx)
    _kill_predictor(ctx)
    _kill_scheduler(ctx)


def _alive(ctx: "Context", node: str) -> bool:
    return nodes(ctx.cluster.scheduler())[node].alive


def _full_pool(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    node2 = cluster.kvstore("node-2")
    capacity = stats(node2).num_pages
    hashes = list(range(9_200_000, 9_200_000 + capacity))
    put(node2, hashes)

    def pinned_full() -> list[int]:
        """Pins every resident block of ours again (pins lapse after pin_lease_s); the pool is then full."""
        present = node2.Lookup(kvstore_pb2.LookupRequest(block_hashes=hashes), timeout=TIMEOUT).present
        resident = [h for h, p in zip(hashes, present) if p]
        node2.Pin(kvstore_pb2.PinRequest(block_hashes=resident), timeout=TIMEOUT)
        return resident

    def full_put() -> Verdict:
        resident = pinned_full()
        s = stats(node2)
        verdict = expect_code(lambda: put(node2, [9_299_999]), grpc.StatusCode.RESOURCE_EXHAUSTED,
                              also=lambda: intact(node2, resident[:8]))
        return Verdict(verdict.ok, f"{verdict.observed}; pool {s.used_pages}/{s.num_pages} used, "
                                   f"{s.pinned_pages} pinned, {s.reserved_pages} reserved")

    rec.case(AREA, "PutBlocks into a full, pinned pool", "RESOURCE_EXHAUSTED; pinned blocks byte-identical", full_put)

    def full_reserve() -> Verdict:
        pinned_full()
        return expect_code(lambda: node2.Reserve(kvstore_pb2.ReserveRequest(
            order_id="o-full", block_hashes=[9_299_990, 9_299_991], lease_ms=5_000, source_node="node-0",
            family="chaos"), timeout=TIMEOUT), grpc.StatusCode.RESOURCE_EXHAUSTED)

    rec.case(AREA, "Reserve on a full, pinned pool", "RESOURCE_EXHAUSTED", full_reserve)

    def full_replicate() -> Verdict:
        source = cluster.kvstore("node-0")
        chain = [9_299_980, 9_299_981]
        put(source, chain)
        pinned_full()
        address = cluster.services["node-2"].address
        code, details = code_of(lambda: _replicate(source, chain, address))
        reply = _last_reply.get("reply")
        failed = code == grpc.StatusCode.RESOURCE_EXHAUSTED or (
            code == grpc.StatusCode.OK and reply is not None and reply.state == common_pb2.ORDER_STATE_FAILED)
        state = common_pb2.OrderState.Name(reply.state) if code == grpc.StatusCode.OK and reply else ""
        return Verdict(failed, f"{code.name} {state} {details[:100]}")

    rec.case(AREA, "Replicate into a full, pinned pool", "the order FAILED (or RESOURCE_EXHAUSTED), not INTERNAL",
             full_replicate)


_last_reply: dict[str, kvstore_pb2.ReplicateResponse] = {}


def _replicate(source, chain: list[int], address: str, order_id: str = "o-chaos-fault",
               timeout: float = TIMEOUT) -> kvstore_pb2.ReplicateResponse:
    reply = source.Replicate(kvstore_pb2.ReplicateRequest(order=order("node-0", "node-2", address, chain, order_id)),
                             timeout=timeout)
    _last_reply["reply"] = reply
    return reply


def _slow_peer(ctx: "Context") -> None:
    """The target stops (SIGSTOP) while a replication to it runs, then
    continues: the source must stay responsive, the replication end in a
    clean state, and the target's reserved pages come back."""
    cluster, rec = ctx.cluster, ctx.recorder
    source = cluster.kvstore("node-0")
    chain = [9_300_001, 9_300_002, 9_300_003]
    put(source, chain)
    address = cluster.services["node-2"].address
    outcome: dict[str, object] = {}

    def replicate() -> None:
        outcome["code"], outcome["details"] = code_of(
            lambda: _replicate(source, chain, address, "o-chaos-slow", timeout=30.0))

    def case() -> Verdict:
        cluster.pause("node-2")
        try:
            worker = threading.Thread(target=replicate, daemon=True)
            worker.start()
            time.sleep(0.3)
            start = time.perf_counter()
            source.Lookup(kvstore_pb2.LookupRequest(block_hashes=chain), timeout=TIMEOUT)
            lookup_ms = (time.perf_counter() - start) * 1e3
            time.sleep(2.0)
        finally:
            cluster.resume("node-2")
        worker.join(40)
        code = outcome.get("code")
        reply = _last_reply.get("reply")
        state = common_pb2.OrderState.Name(reply.state) if code == grpc.StatusCode.OK and reply else ""
        freed = wait_until(lambda: stats(cluster.kvstore("node-2")).reserved_pages == 0, 15.0)
        back = wait_until(lambda: _alive(ctx, "node-2"), COME_BACK_S)
        clean = code is not None and code not in SERVER_FAULTS and not worker.is_alive()
        return Verdict(clean and freed and back, f"Replicate ended {getattr(code, 'name', 'NOT AT ALL')} {state}; "
                                                 f"the source answered a Lookup in {lookup_ms:.0f} ms meanwhile; "
                                                 f"target's reserved pages freed: {freed}; target alive again: {back}")

    rec.case(AREA, "slow peer: the target stops for 2 s mid-replication",
             "the source keeps answering; the replication ends (committed late or failed), never INTERNAL or hung; "
             "no reserved page leaks", case)


def _partition(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    assert cluster.partition is not None
    node = cluster.partitioned_node
    sched = cluster.scheduler()
    direct = cluster.kvstore(node)

    def case() -> Verdict:
        traffic = Traffic(cluster).start()
        cluster.partition.cut()
        try:
            cut_at = time.monotonic()
            down = wait_until(lambda: not _alive(ctx, node), cluster.spec.node_timeout_s + DETECT_SLACK_S)
            down_at = time.monotonic()
            submit = expect_code(lambda: sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order(
                "node-0", node, cluster.forwarders[1].address, [9_400_001])), timeout=TIMEOUT),
                grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED)
            put(direct, [9_400_100])  # written while cut off: the scheduler must learn of it after the heal
            time.sleep(1.0)
        finally:
            cluster.partition.heal()
        heal_at = time.monotonic()
        back = wait_until(lambda: _alive(ctx, node), COME_BACK_S)
        indexed = wait_until(lambda: nodes(sched)[node].num_blocks >= 1, COME_BACK_S)
        traffic.stop()
        # sent after the client saw it down and answered before the heal: decided while it was down
        to_cut = sum(1 for sent, done, n in traffic.answered if down_at <= sent and done < heal_at and n == node)
        ok = down and back and indexed and to_cut == 0 and traffic.faults() == 0 and submit.ok
        return Verdict(ok, f"{cluster.partition.mechanism}; marked down {down_at - cut_at:.1f} s after the cut: "
                           f"{down}; SubmitOrder to it: {submit.observed}; routes to it while down: {to_cut}; "
                           f"Route codes {traffic.codes}; alive after the heal: {back}; "
                           f"its blocks indexed again: {indexed}")

    rec.case(AREA, f"partition: {node} cut off from the scheduler both ways",
             "marked down within node_timeout_s; no route or order to it while down; Route never INTERNAL; after "
             "the heal it is alive and its index caught up", case)


def _kill_kvstore(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    victim = "node-1"

    def case() -> Verdict:
        traffic = Traffic(cluster).start()
        time.sleep(0.5)
        status = cluster.kill9(victim)
        killed_at = time.monotonic()
        down = wait_until(lambda: not _alive(ctx, victim), cluster.spec.node_timeout_s + DETECT_SLACK_S)
        down_at = time.monotonic()
        time.sleep(1.0)
        traffic.stop()
        after = [n for sent, _, n in traffic.answered if sent > down_at]
        ok = status == -9 and down and victim not in after and traffic.faults() == 0 and after
        return Verdict(bool(ok), f"exit {status}; marked down {down_at - killed_at:.1f} s after: {down}; "
                                 f"routes after: {len(after)}, to it: {after.count(victim)}; codes {traffic.codes}")

    rec.case(AREA, f"kill -9 {victim} mid-traffic", "marked down within node_timeout_s; routes go elsewhere; Route "
             "never INTERNAL", case)

    def restart() -> Verdict:
        cluster.drop_channels(victim)
        cluster.restart(victim)
        back = wait_until(lambda: _alive(ctx, victim), COME_BACK_S)
        put(cluster.kvstore(victim), [9_500_001])
        return Verdict(back, f"re-registered and alive: {back} (its pool starts empty: KV is a cache)")

    rec.case(AREA, f"{victim} started again on its port", "it re-registers and is routable again", restart)


def _kill_predictor(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder

    def case() -> Verdict:
        traffic = Traffic(cluster).start()
        time.sleep(0.5)
        status = cluster.kill9("predictor")
        time.sleep(2.0)
        cluster.drop_channels("predictor")
        cluster.restart("predictor")
        time.sleep(0.5)
        traffic.stop()
        forecast = expect_code(lambda: cluster.predictor().Forecast(predictor_pb2.ForecastRequest(), timeout=TIMEOUT),
                               grpc.StatusCode.OK)
        ok = status == -9 and traffic.faults() == 0 and set(traffic.codes) == {"OK"} and forecast.ok
        return Verdict(ok, f"exit {status}; Route codes while it was down and after: {traffic.codes}; "
                           f"Forecast after the restart: {forecast.observed}")

    rec.case(AREA, "kill -9 the predictor mid-traffic", "every Route still answered OK (arrival reports are "
             "best effort); after a restart on its port it forecasts", case)


def _kill_scheduler(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    sched = cluster.scheduler()
    before_policy = sched.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT)
    chosen = next(p for p in before_policy.available if p != before_policy.name and p != "oracle")

    def case() -> Verdict:
        sched.SetPolicy(scheduler_pb2.SetPolicyRequest(name=chosen), timeout=TIMEOUT)
        address = cluster.services["node-2"].address
        ids = [sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order(
            "node-0", "node-2", address, [9_600_000 + i])), timeout=TIMEOUT).order_id for i in range(5)]
        totals_before = sum(c.count for c in cluster_state(sched).orders)
        traffic = Traffic(cluster, retries=True).start()
        time.sleep(0.5)
        status = cluster.kill9("scheduler")
        time.sleep(0.5)
        cluster.drop_channels("scheduler")
        cluster.restart("scheduler")
        fresh = cluster.scheduler()
        nodes_back = wait_until(lambda: all(n.alive for n in nodes(fresh).values()), COME_BACK_S)
        time.sleep(0.5)
        traffic.stop()
        policy = fresh.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT).name
        totals_after = sum(c.count for c in cluster_state(fresh).orders)
        new_id = fresh.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order(
            "node-0", "node-2", address, [9_600_100])), timeout=TIMEOUT).order_id
        fresh.SetPolicy(scheduler_pb2.SetPolicyRequest(name=before_policy.name), timeout=TIMEOUT)
        ok = (status == -9 and policy == chosen and totals_after >= totals_before and new_id > max(ids)
              and new_id not in ids and traffic.lost == 0 and traffic.faults() == 0 and nodes_back)
        return Verdict(ok, f"exit {status}; policy {policy!r} (set {chosen!r}); orders {totals_before} -> "
                           f"{totals_after}; ids before up to {max(ids)}, new {new_id}; replay requests lost: "
                           f"{traffic.lost} of {len(traffic.answered) + traffic.lost} (codes {traffic.codes}); "
                           f"every node alive again: {nodes_back}")

    rec.case(AREA, "kill -9 the scheduler under replay, restart on its --state-dir",
             "policy and orders kept, order ids never reused, no replay request lost (the router retries), every "
             "node back", case)
