"""Every policy makes the same decisions live and in simulation, on one
scripted scenario.

Live: the real scheduler service over gRPC (RegisterNode, Heartbeat, Route,
ReportOrderStatus), its KV events decoded from the kvstore's proto as its
event streams decode them, forecasts from a real predictor service fed by
the scheduler's own arrival reports, the oracle's future from a trace file.
Simulated: the objects loadgen/sim/simulation.py wires, called directly: a
SchedulerCore with the predictor core in process (CoreArrivals,
CoreForecasts) and the oracle's future from the same requests
(TraceFutureArrivals). Both run on one manual clock, the live ticker kept
out of the way (each side ticks when the script says); before a predictive
tick the script waits until the live predictor has observed every route.
The two sides and the script live in tests/support/live_sim.py.

Compared after every step: each route's node and cached prefix, and each
tick's orders (action, source, target, blocks, tier, lease, family).
"""
from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from tests.support.live_sim import POLICIES, START, live_and_simulated, script


@pytest.mark.parametrize("policy", POLICIES)
def test_the_same_decisions_live_and_simulated(policy: str, tmp_path) -> None:
    steps = script()
    with live_and_simulated(policy, ManualClock(START), steps, tmp_path) as pair:
        for t, step, args in steps:
            pair.step(t, step, args)
        assert pair.routes == 16
        print(f"{policy}: {pair.decisions} orders, the same live and simulated")
        if policy != "none":
            assert pair.decisions > 0, policy  # the script gives these something to decide
