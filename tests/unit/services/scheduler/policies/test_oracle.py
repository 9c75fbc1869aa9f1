"""The oracle sees the future the routers will bring: its trace is keyed into
families exactly as the e2e replay keys its routes, and with conversation
families it replicates a returning conversation off its swamped holder.

The live quick comparison once reported `oracle` replicating 0 bytes: its
trace was loaded with first-block families ("0" for every request of the
conversation trace, a family every node holds within seconds), and the
planner's demand floor (3 requests within the horizon) is more than any
conversation family of the whole trace ever brings."""
from __future__ import annotations

import json
from pathlib import Path

from speckv.loadgen.bench.e2e.run import cluster_spec, write_restamped_trace
from speckv.loadgen.experiments.e2e_config import SliceSpec, load_e2e_config
from speckv.services.common.config import parse_config
from speckv.services.common.ids import Family
from speckv.services.common.traces import TraceRequest, load_mooncake
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.server import future_arrivals
from speckv.services.scheduler.forecasts import TraceFutureArrivals
from tests.support.scheduler_scenarios import BS, heartbeat_all, load, make_core, store

ROWS = [  # two conversations behind one shared system-prompt block (id 0)
    {"timestamp": 0, "input_length": 1600, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 500, "input_length": 1600, "output_length": 5, "hash_ids": [0, 7, 8]},
    {"timestamp": 3000, "input_length": 2200, "output_length": 5, "hash_ids": [0, 1, 2, 3, 4]},
]


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_the_oracle_counts_the_families_the_e2e_router_sends(tmp_path):
    config = load_e2e_config()
    assert config.family == "conversation"
    requests = load_mooncake(_trace(tmp_path), family=config.family)  # what the router routes
    slice_ = SliceSpec(0.0, 10.0, 2.0)
    oracle_trace = tmp_path / "oracle.jsonl"
    write_restamped_trace(oracle_trace, requests, slice_)
    args = cluster_spec(config, oracle_trace, 1000.0, slice_.speed).extra_args["scheduler"]
    scheduler = parse_config(SchedulerConfig, [*args, "--policy", "oracle"], {}, prog="speckv scheduler")
    counts = future_arrivals(scheduler).counts(999.0, 1010.0)
    assert counts == {"0/1": 2, "0/7": 1}
    assert set(counts) == {r.family for r in requests}


def test_the_oracle_replicates_a_returning_conversation_off_its_swamped_holder():
    first = [0, *range(100, 200)]  # a 1,600-token first turn behind the shared block 0
    family = Family("0/100")
    returns = TraceRequest(3.0, 2200, 5, (*first, 200, 201), BS, family)
    other = TraceRequest(0.5, 1600, 5, (0, *range(300, 400)), BS, Family("0/300"))
    core, clock = make_core(nodes=3, policy="oracle", future=TraceFutureArrivals([other, returns], 100.0))
    heartbeat_all(core, 3)
    store(core, "n0", first, family)
    store(core, "n1", list(other.block_hashes), other.family)
    core.route("t1", first, len(first) * BS + 3, family)  # the catalog learns the family from its route
    load(core, "n0", queued_tokens=2_000_000)  # n0 is swamped when the conversation returns
    clock.set(101.0)  # it returns at 103, within the planner's horizon
    orders = core.tick()
    assert [(o.spec.family, o.spec.source, o.spec.block_hashes) for o in orders] == [(family, "n0", first)]
    assert orders[0].spec.target in {"n1", "n2"} and orders[0].spec.policy == "oracle"
    clock.set(110.0)
    assert core.tick() == []  # nothing returns any more: no new order
