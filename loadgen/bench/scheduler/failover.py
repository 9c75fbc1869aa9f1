"""`speckv bench scheduler --replicas N`: kill -9 the leading scheduler replica
under load, and count what the cluster lost (issue 46; docs/replicas.md).

A local cluster of real processes (LocalCluster: a one-member etcd, N
scheduler replicas, 3 kvstores, the predictor). For `seconds`:
- a router (RoutingClient over every replica's channel) routes requests at
  `route_rate`/s from one thread, each a fresh 4-block prefix of one of 64
  families;
- an operator submits one order every `order_interval_s` to whichever
  replica leads (asked of any replica; a refusal or a dead replica sends it
  to the next): a retain of a node's prefix, so every order runs and commits
  without moving bytes. An order is *accepted* when SubmitOrder returned
  its id.
At `kill_at_s` the leader gets SIGKILL. Then, after a settle period:
- failover_s: from the kill to the first answer of a surviving replica
  saying it leads (polled every 20 ms). Bound: 2 x lease_s.
- orders_lost: accepted orders that are not in the shared state the new
  leader journals (etcd), in any state; orders_stuck: accepted orders still
  ISSUED or IN_FLIGHT there after the settle period (an agent's report that
  reached no leader; they expire with their lease).
- orders_duplicated: order ids a kvstore executed more than once (counted
  where orders run, apart from the fence: kvstore GetStats order_counters).
- route_unanswered: routes no replica answered (the router fell back), and
  max_route_gap_s: the longest time between two scheduler answers.
Targets (issue 46): failover_s <= 5 at the default lease (2 s);
orders_lost = orders_duplicated = route_unanswered = 0.
"""
from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import grpc

from speckv.services.client.routing import SCHEDULER_CHANNEL_OPTIONS, ClientSettings, RouteSource, RoutingClient
from speckv.services.cluster.launcher import ClusterSpec, LocalCluster
from speckv.services.scheduler.leadership.adapters.etcd_keys import EtcdKeys
from speckv.services.scheduler.leadership.state_store import EtcdStateStore
from speckv.services.scheduler.orders import OrderState
from speckv.v1 import common_pb2, kvstore_pb2, kvstore_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

CLUSTER_NAME = "speckv"  # the scheduler's default --cluster-name, which the launcher keeps


@dataclass(frozen=True, slots=True)
class FailoverSettings:
    replicas: int = 2
    seconds: float = 12.0
    kill_at_s: float = 4.0
    settle_s: float = 4.0
    route_rate: float = 100.0
    order_interval_s: float = 0.05
    lease_s: int = 2  # the scheduler's default --lease-s


@dataclass(slots=True)
class _Tally:
    accepted: list[str] = field(default_factory=list)
    submit_refused: int = 0
    answered_at: list[float] = field(default_factory=list)
    fallbacks: int = 0


def run_failover(settings: FailoverSettings, environ: Mapping[str, str]) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="speckv-failover-") as run_dir:
        cluster = LocalCluster(ClusterSpec(nodes=3, replicas=settings.replicas), Path(run_dir), environ)
        cluster.start(timeout_s=120.0)
        try:
            return _drill(cluster, settings)
        finally:
            cluster.stop()


def _drill(cluster: LocalCluster, settings: FailoverSettings) -> dict[str, object]:
    addresses = dict(cluster.scheduler_addresses())
    channels = {name: grpc.insecure_channel(a, options=SCHEDULER_CHANNEL_OPTIONS) for name, a in addresses.items()}
    stubs = {name: scheduler_pb2_grpc.SchedulerStub(c) for name, c in channels.items()}
    tally, stop = _Tally(), threading.Event()
    client = RoutingClient(list(channels.values()), nodes=cluster.node_addresses(),
                           settings=ClientSettings(deadline_s=0.5))
    threads = [threading.Thread(target=_route_loop, args=(client, settings, tally, stop), daemon=True),
               threading.Thread(target=_order_loop, args=(stubs, settings, tally, stop), daemon=True)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(settings.kill_at_s)
    leader = _leader(stubs)
    killed_at = time.monotonic()
    cluster.kill_scheduler(leader)
    survivors = {n: s for n, s in stubs.items() if n != leader}
    new_leader = _await_leader(survivors, killed_at + 6 * settings.lease_s)
    failover_s = time.monotonic() - killed_at if new_leader else None
    time.sleep(max(0.0, start + settings.seconds - time.monotonic()))
    stop.set()
    for thread in threads:
        thread.join()
    time.sleep(settings.settle_s)
    saved = EtcdStateStore(EtcdKeys(cluster.etcd_endpoint, timeout_s=2.0, tls=cluster.etcd_tls), CLUSTER_NAME).load()
    states = {o.order_id: o.state for o in saved.orders}
    run_twice = sum(_order_counters(a).get("run_twice", 0) for a in cluster.node_addresses().values())
    counters = client.counters()
    for channel in channels.values():
        channel.close()
    gaps = [b - a for a, b in zip(tally.answered_at, tally.answered_at[1:])]
    return {
        "replicas": settings.replicas, "lease_s": settings.lease_s, "killed": leader, "new_leader": new_leader,
        "failover_s": failover_s, "failover_bound_s": 2 * settings.lease_s,
        "orders_accepted": len(tally.accepted), "orders_refused_at_submit": tally.submit_refused,
        "orders_lost": sum(1 for o in tally.accepted if o not in states),
        "orders_stuck": sum(1 for o in tally.accepted if states.get(o) in (OrderState.ISSUED, OrderState.IN_FLIGHT)),
        "orders_committed": sum(1 for o in tally.accepted if states.get(o) is OrderState.COMMITTED),
        "orders_duplicated": run_twice,
        "routes": counters.routes, "route_unanswered": counters.routes_fallback,
        "routes_retried": counters.routes_retried, "max_route_gap_s": max(gaps) if gaps else None,
    }


def _route_loop(client: RoutingClient, settings: FailoverSettings, tally: _Tally, stop: threading.Event) -> None:
    i, interval = 0, 1.0 / settings.route_rate
    while not stop.is_set():
        family = i % 64
        base = 10_000_000 + 1_000 * family
        routed = client.route(f"r{i}", [base, base + 1, base + 2, base + 3 + i % 500], 4 * 4 + 3,
                              family=f"f{family}")
        client.done(f"r{i}")
        if routed.source is RouteSource.SCHEDULER:
            tally.answered_at.append(time.monotonic())
        else:
            tally.fallbacks += 1
        i += 1
        stop.wait(interval)


def _order_loop(stubs: Mapping[str, scheduler_pb2_grpc.SchedulerStub], settings: FailoverSettings, tally: _Tally,
                stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        node = f"node-{i % 3}"
        order = common_pb2.ReplicationOrder(family=f"f{i % 64}", block_hashes=[20_000_000 + i], source_node=node,
                                            target_node=node, lease_ms=30_000, action="retain")
        for stub in stubs.values():
            try:
                tally.accepted.append(stub.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order),
                                                       timeout=1.0).order_id)
                break
            except grpc.RpcError:
                tally.submit_refused += 1  # not the leader, or gone: the next replica
        i += 1
        stop.wait(settings.order_interval_s)


def _leader(stubs: Mapping[str, scheduler_pb2_grpc.SchedulerStub]) -> str:
    for name, stub in stubs.items():
        state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=2.0)
        if state.leadership.answering_is_leader:
            return name
    raise RuntimeError("no scheduler replica leads")


def _await_leader(stubs: Mapping[str, scheduler_pb2_grpc.SchedulerStub], deadline: float) -> str | None:
    while time.monotonic() < deadline:
        for name, stub in stubs.items():
            try:
                if stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=0.5).leadership.answering_is_leader:
                    return name
            except grpc.RpcError:
                pass
        time.sleep(0.02)
    return None


def _order_counters(address: str) -> dict[str, int]:
    with grpc.insecure_channel(address) as channel:
        stats = kvstore_pb2_grpc.KVStoreStub(channel).GetStats(kvstore_pb2.StatsRequest(), timeout=2.0)
    return dict(stats.order_counters)
