"""An analysis, not a policy: how much could the burst tail gain if a
request could wait for a replica of its prefix already on its way to a
node, instead of prefilling cold or queueing where it went?

Runs each POLICY on a synthetic slice and logs every replica's order time
and commit (landing) time. For each burst-window request served with less
of its family's chain than an in-flight replica of that chain would give
it (ordered at or before the request's arrival, landing after it), the
what-if TTFT is: the wait until the replica lands + the prefill with the
replica's prefix cached (the engine profile's prefill_ms). An upper bound
of the gain: it leaves out the queue at the replica's node, which these
requests would share, and the link the replica's own transfer holds. The
burst p99 with min(actual, what-if) per request is printed beside the
actual one, with how many requests could have waited.

    .venv/bin/python docs/scripts/inflight_wait_bound.py agent-cascades 11 reactive-heat,predictive
"""
import math
import sys

import numpy as np
from synthetic_slice import synthetic_slice

from speckv.loadgen.experiments.metrics import burst_seconds
from speckv.services.scheduler.replication import outcomes as outcomes_module
from speckv.services.scheduler.orders import OrderState

scenario, seed, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
chosen = synthetic_slice(scenario, 16, 1800, 600, seed)
bursts = burst_seconds(chosen.workload.times.tolist())
block_tokens = chosen.workload[chosen.lo].block_tokens  # one block size per scenario
landings: dict = {}  # order id -> (family, target, blocks, ordered at, committed at)
original_transition = outcomes_module.ActionOutcomes.transition


def logging_transition(self, order, now):
    if order.state is OrderState.COMMITTED and order.spec.action.copies:
        landings[order.order_id] = (order.spec.family, order.spec.target, len(order.spec.block_hashes),
                                    order.created_at, now)
    return original_transition(self, order, now)


outcomes_module.ActionOutcomes.transition = logging_transition


def p99(values):
    return float(np.percentile(np.asarray(values), 99)) if values else math.nan


for policy in policies:
    landings.clear()
    sim = chosen.simulation(policy)
    records = [r for r in sim.run().records if r.served and math.floor(r.arrival_s) in bursts]
    profile = sim.core.context.profile
    by_family: dict = {}
    for family, target, blocks, ordered, landed in landings.values():
        by_family.setdefault(family, []).append((ordered, landed, target, blocks))
    actual, bound, could = [], [], 0
    for r in records:
        best = r.ttft_ms
        for ordered, landed, target, blocks in by_family.get(r.family, ()):
            if not ordered <= r.arrival_s < landed:
                continue
            cached = min(blocks * block_tokens, r.prompt_tokens - 1)
            if cached <= r.cached_tokens + r.fetched_tokens:
                continue
            whatif = (landed - r.arrival_s) * 1e3 + profile.prefill_ms(r.prompt_tokens - cached, cached)
            best = min(best, whatif)
        could += best < r.ttft_ms
        actual.append(r.ttft_ms)
        bound.append(best)
    print(f"{scenario} seed {seed} {policy}: {len(records)} burst requests, {len(landings)} replicas landed; "
          f"{could} could have waited for one in flight and been faster; burst p99 {p99(actual):.0f} ms, "
          f"with the wait (bound) {p99(bound):.0f} ms")
