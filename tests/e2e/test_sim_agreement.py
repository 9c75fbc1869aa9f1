"""The simulator agrees with the live cluster: the same slice, the same
configuration (services/config/e2e.json), live through the real services
(bench/_e2e_run.run_policy) and in virtual time (SimSettings.from_e2e with
the live replay's speed, so heartbeats and ticks fall at the same trace
times). p50 TTFT per policy must agree within 35 % of the larger of the
two + 25 ms (symmetric: live may come out faster or slower).

Why that tolerance: live TTFT carries what the model leaves out on purpose:
the Route RPC and the dispatch (~1-3 ms of wall each, x speed 2 in trace
time), the engine loop's 2 ms poll (4 ms of trace time), blocks stored a
few ms after the first token (asynchronous PutBlocks), and heartbeats whose
load is up to 0.2 s of trace time stale and sometimes overwritten by the
kvstores' own (queue-less) heartbeats. Each shifts a routing choice or a
queue by tens of ms; on a 12 s slice of ~40 requests a p50 of ~0.6-1 s
moves by up to ~20 % from one such choice, more on a loaded machine: four
live runs of `none` on this slice gave p50 506, 582, 670 and, in a CI run,
450 ms (the simulation, deterministic, 676 ms), a +-20 % spread around their
mean, so the bound is the model's own ~20 % plus most of that spread, taken
of the larger p50 so that a fast live run is held to the same bound as a
slow one (against the live p50 alone, 450 ms allowed only 183 ms). At these
p50s a simulation twice the live p50, or half of it, still fails. A
looser bound would hide a wrong time model (a missing prefill, a pull not
charged: factors of 2 and more); a tighter one would be flaky on 2 cores.
"""
from __future__ import annotations

from speckv.loadgen.bench._e2e_run import run_policy
from speckv.loadgen.e2e_config import SliceSpec, load_e2e_config
from speckv.loadgen.metrics import percentile
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.traces import load_mooncake

POLICIES = ("none", "reactive-heat")
REL, ABS_MS = 0.35, 25.0


def test_p50_ttft_agrees_with_the_live_cluster(traces_dir):
    config = load_e2e_config()
    trace = load_mooncake(traces_dir / "mooncake_conversation_trace.jsonl", family=config.family)
    quick = config.slices["quick"]
    slice_ = SliceSpec(quick.start_s, 12.0, quick.speed)
    requests = [r for r in trace if slice_.start_s <= r.arrival_s < slice_.start_s + slice_.duration_s]
    history = [r for r in trace if slice_.start_s - config.warmup_s <= r.arrival_s < slice_.start_s]
    settings = SimSettings.from_e2e(config, speed=slice_.speed)
    for policy in POLICIES:
        live = run_policy(config, policy, trace, slice_, {}, lambda total, done, record: None)
        sim = Simulation(config, settings, policy, requests, history).run()
        live_p50 = percentile([r.ttft_ms for r in live.records if r.served], 50)
        sim_p50 = percentile([r.ttft_ms for r in sim.records if r.served], 50)
        assert len(sim.records) == len(live.records) == len(requests)
        assert all(r.served for r in sim.records)
        print(f"{policy}: live p50 {live_p50:.1f} ms, simulated p50 {sim_p50:.1f} ms")
        assert abs(sim_p50 - live_p50) <= REL * max(live_p50, sim_p50) + ABS_MS, (policy, live_p50, sim_p50)
