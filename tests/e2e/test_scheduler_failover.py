"""The failover drill of issue 46 on real processes: a one-member etcd, two
scheduler replicas and three kvstores (LocalCluster), routes and orders
flowing, and the leading replica killed with SIGKILL. Another replica takes
the lead, no accepted order is lost or run twice, and every route is still
answered by a scheduler (none falls back)."""
from __future__ import annotations

import os

import pytest

from speckv.loadgen.bench.scheduler.failover import FailoverSettings, run_failover
from speckv.services.cluster.etcd_process import MISSING
from tests.support.etcd import etcd_binary


@pytest.mark.skipif(etcd_binary() is None, reason=MISSING)
def test_the_leader_killed_under_load_loses_and_repeats_nothing():
    results = run_failover(FailoverSettings(seconds=8.0, kill_at_s=3.0, settle_s=3.0, route_rate=50.0),
                           dict(os.environ))
    assert results["new_leader"] not in (None, results["killed"])
    assert results["orders_accepted"] > 0
    assert results["orders_lost"] == 0
    assert results["orders_duplicated"] == 0
    assert results["orders_stuck"] == 0
    assert results["orders_committed"] == results["orders_accepted"]
    assert results["routes"] > 0 and results["route_unanswered"] == 0
