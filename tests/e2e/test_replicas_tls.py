"""`speckv up --tls --replicas 2` (LocalCluster): etcd serves https and
refuses a client without the cluster's certificate; the schedulers, which
present theirs, elect one leader on it, and a RoutingClient given both
replicas as its target list (dialled with the admin's certificate) is
answered by them."""
from __future__ import annotations

import os

import pytest

from speckv.services.client.routing import SCHEDULER_CHANNEL_OPTIONS, RouteSource, RoutingClient
from speckv.services.cluster.etcd_process import MISSING
from speckv.services.cluster.launcher import ClusterSpec, LocalCluster
from speckv.services.common.errors import Unavailable
from speckv.services.common.rpc.tls import dial
from speckv.services.scheduler.leadership.adapters.etcd_keys import EtcdKeys
from speckv.services.scheduler.leadership.campaign import decode_holder
from speckv.services.scheduler.leadership.keys import leader_key
from tests.support.etcd import etcd_binary
from tests.support.waiting import wait_until


@pytest.mark.skipif(etcd_binary() is None, reason=MISSING)
def test_replicas_elect_on_a_tls_etcd_and_answer_routes(tmp_path):
    with LocalCluster(ClusterSpec(nodes=1, replicas=2, tls=True), tmp_path, dict(os.environ)) as cluster:
        assert cluster.etcd_endpoint.startswith("https://")
        keys = EtcdKeys(cluster.etcd_endpoint, timeout_s=2.0, tls=cluster.etcd_tls)
        assert wait_until(lambda: keys.read(leader_key("speckv")) is not None, timeout=60.0)
        leader_id, _ = decode_holder(keys.read(leader_key("speckv")).value)
        assert leader_id in cluster.scheduler_addresses()
        with pytest.raises(Unavailable):
            EtcdKeys(cluster.etcd_endpoint.replace("https://", "http://"), timeout_s=2.0).read(leader_key("speckv"))

        admin = cluster.admin_tls
        client = RoutingClient(",".join(cluster.scheduler_addresses().values()),
                               dial=lambda a: dial(a, admin, "scheduler", SCHEDULER_CHANNEL_OPTIONS))
        try:
            routed = [client.route(f"r{i}", [], 16) for i in range(10)]
            assert {r.source for r in routed} == {RouteSource.SCHEDULER} and {r.node_id for r in routed} == {"node-0"}
        finally:
            client.close()
