"""The agent fan-out generator (loadgen/workload/fanout.py) and its scenario.

The requests alone show the task structure: within a family (one task) the
parent is the first request, every other request's predecessor is the
longest earlier prompt its block chain extends, sub-agents' first calls are
the parent's children that have follow-ups of their own (rounds >= 1), and
the aggregation is the parent's child that has none. Statistical checks use
runs long enough that each bound is 5 standard deviations of its estimate,
so a wrong parameter fails while a right one passes for any seed."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from speckv.loadgen.workload.fanout import FanoutParams, fanout
from speckv.loadgen.workload.scenarios import get_scenario
from speckv.loadgen.workload.synthetic import FamilyShape
from speckv.services.common.traces import TraceRequest

SHAPE = FamilyShape(families=20, zipf_s=1.0, prefix_blocks=4, max_suffix_blocks=3, block_tokens=16,
                    output_tokens=(5, 9))
# call_s fixed at 1 s, so a follow-up's gap minus 1 s is its tool pause, and
# a sub-agent's first call comes 1 s + U(0, spread_s) after its parent.
LONG = FanoutParams(duration_s=4000.0, task_rate=0.5, context_blocks=(1, 5), call_s=(1.0, 1.0), subagents=(2, 6),
                    spread_s=3.0, rounds=(1, 3), tool_pause_median_s=5.0, tool_pause_sigma=0.7, seed=3)
SETTLE_S = 600.0  # tasks starting this long before the end are whole (a pause > 100 s is < 1e-9 likely)


@dataclass
class Task:
    parent: TraceRequest
    lineages: list[list[TraceRequest]] = field(default_factory=list)  # each sub-agent's calls, in order
    aggregation: TraceRequest | None = None


def families(requests: list[TraceRequest]) -> dict[str, list[TraceRequest]]:
    by_family: dict[str, list[TraceRequest]] = {}
    for r in requests:
        by_family.setdefault(r.family, []).append(r)
    return by_family


def whole_tasks_of(requests: list[TraceRequest], params: FanoutParams) -> list[Task]:
    """The tasks whose parent arrived SETTLE_S before the end (none of their calls were cut), parsed."""
    out: list[Task] = []
    for family, rs in families(requests).items():
        if rs[0].arrival_s >= params.duration_s - SETTLE_S:
            continue
        predecessor: dict[int, int] = {}
        for i, r in enumerate(rs[1:], start=1):
            extended = [j for j in range(i) if r.block_hashes[:len(rs[j].block_hashes)] == rs[j].block_hashes]
            assert extended, f"{family}: request {i} extends no earlier prompt of its task"
            predecessor[i] = max(extended, key=lambda j: len(rs[j].block_hashes))
        children: dict[int, list[int]] = {}
        for i, j in predecessor.items():
            children.setdefault(j, []).append(i)
        task = Task(rs[0])
        for i in children.get(0, []):
            if i not in children:
                assert task.aggregation is None, f"{family}: two parent children without follow-ups"
                task.aggregation = rs[i]
                continue
            lineage = [i]
            while lineage[-1] in children:
                (nxt,) = children[lineage[-1]]  # a sub-agent's calls form a chain, never a tree
                lineage.append(nxt)
            task.lineages.append([rs[k] for k in lineage])
        out.append(task)
    return out


@pytest.fixture(scope="module")
def long_run() -> list[TraceRequest]:
    return fanout(LONG, SHAPE)


@pytest.fixture(scope="module")
def whole_tasks(long_run) -> list[Task]:
    tasks = whole_tasks_of(long_run, LONG)
    assert len(tasks) > 1000
    return tasks


# --- structure -------------------------------------------------------------------------------

def test_requests_are_sorted_well_formed_and_named_by_template_and_task(long_run):
    times = [r.arrival_s for r in long_run]
    assert times == sorted(times) and 0.0 <= times[0] and times[-1] < LONG.duration_s
    parent_of: dict[int, int | None] = {}
    for r in long_run:
        _, template, task = r.family.split("-")
        assert r.family == f"fan-{int(template)}-{int(task)}" and 0 <= int(template) < SHAPE.families
        n = SHAPE.prefix_blocks
        assert r.block_hashes[:n] == tuple(range(int(template) * n + 1, (int(template) + 1) * n + 1))
        assert len(set(r.block_hashes)) == len(r.block_hashes) and all(0 < h < 2**62 for h in r.block_hashes)
        assert r.block_tokens == SHAPE.block_tokens and r.full_blocks == len(r.block_hashes)
        full = len(r.block_hashes) * SHAPE.block_tokens
        assert full < r.prompt_tokens < full + SHAPE.block_tokens  # the prompt ends in a partial block
        assert SHAPE.output_tokens[0] <= r.output_tokens <= SHAPE.output_tokens[1]
        # A chained id always follows the same one (hash_i = H(hash_{i-1}, block i)).
        for parent, h in zip((None, *r.block_hashes), r.block_hashes):
            assert parent_of.setdefault(h, parent) == parent


def test_tasks_never_share_a_block_past_their_template(long_run):
    owner: dict[int, str] = {}
    for r in long_run:
        for h in r.block_hashes[SHAPE.prefix_blocks:]:
            assert owner.setdefault(h, r.family) == r.family
    assert min(owner) > SHAPE.families * SHAPE.prefix_blocks  # fresh ids sit past every template's


def test_every_sub_agent_call_starts_with_the_parents_whole_prompt(long_run, whole_tasks):
    calls = [(t, r) for t in whole_tasks for lineage in t.lineages for r in lineage]
    assert len(calls) > 10_000
    shared = sum(r.block_hashes[:len(t.parent.block_hashes)] == t.parent.block_hashes for t, r in calls)
    assert shared / len(calls) == 1.0
    # So does every request of every task, cut short at the end or not.
    for rs in families(long_run).values():
        assert all(r.block_hashes[:len(rs[0].block_hashes)] == rs[0].block_hashes for r in rs)
        lo, hi = LONG.context_blocks
        assert lo <= len(rs[0].block_hashes) - SHAPE.prefix_blocks <= hi


def test_follow_ups_extend_their_own_previous_prompt_and_the_aggregation_the_parents(whole_tasks):
    for task in whole_tasks:
        assert task.aggregation is not None
        for lineage in task.lineages:
            assert 1 <= len(lineage[0].block_hashes) - len(task.parent.block_hashes) <= SHAPE.max_suffix_blocks
            assert LONG.rounds[0] <= len(lineage) - 1 <= LONG.rounds[1]
            for previous, call in zip(lineage, lineage[1:]):
                assert call.block_hashes[:len(previous.block_hashes)] == previous.block_hashes
                assert 1 <= len(call.block_hashes) - len(previous.block_hashes) <= SHAPE.max_suffix_blocks
                assert call.arrival_s > previous.arrival_s + LONG.call_s[0]
        # One block per sub-agent's result, once the last sub-agent's last call is done.
        aggregation = task.aggregation
        assert aggregation.block_hashes[:len(task.parent.block_hashes)] == task.parent.block_hashes
        assert len(aggregation.block_hashes) - len(task.parent.block_hashes) == len(task.lineages)
        last = max(lineage[-1].arrival_s for lineage in task.lineages)
        assert aggregation.arrival_s == pytest.approx(last + LONG.call_s[0])


# --- the stated parameters -------------------------------------------------------------------

def test_tasks_arrive_at_the_task_rate(long_run):
    parents = np.array([rs[0].arrival_s for rs in families(long_run).values()])
    for lo, hi in [(0.0, LONG.duration_s), (0.0, 2000.0), (2000.0, 4000.0)]:
        count = int(((parents >= lo) & (parents < hi)).sum())
        mean = LONG.task_rate * (hi - lo)
        assert abs(count - mean) < 5 * math.sqrt(mean), ((lo, hi), count, mean)


def test_fan_out_k_has_the_stated_mean_and_range(whole_tasks):
    ks = np.array([len(t.lineages) for t in whole_tasks])
    lo, hi = LONG.subagents
    assert ks.min() == lo and ks.max() == hi
    sd = math.sqrt(((hi - lo + 1) ** 2 - 1) / 12 / len(ks))  # discrete uniform
    assert abs(ks.mean() - (lo + hi) / 2) < 5 * sd, ks.mean()


def test_sub_agents_arrive_within_the_spread_a_call_after_their_parent(whole_tasks):
    offsets = np.array([lineage[0].arrival_s - t.parent.arrival_s - LONG.call_s[0]
                        for t in whole_tasks for lineage in t.lineages])
    assert offsets.min() >= 0.0 and offsets.max() <= LONG.spread_s
    sd = LONG.spread_s / math.sqrt(12 * len(offsets))
    assert abs(offsets.mean() - LONG.spread_s / 2) < 5 * sd, offsets.mean()
    spans = [max(x[0].arrival_s for x in t.lineages) - min(x[0].arrival_s for x in t.lineages) for t in whole_tasks]
    assert max(spans) <= LONG.spread_s


def test_tool_pauses_are_lognormal_with_the_stated_median(whole_tasks):
    pauses = np.array([call.arrival_s - previous.arrival_s - LONG.call_s[0]
                       for t in whole_tasks for lineage in t.lineages
                       for previous, call in zip(lineage, lineage[1:])])
    logs = np.log(pauses)
    n, sigma = len(logs), LONG.tool_pause_sigma
    # The sample median of a normal has sd ~ 1.2533 sigma / sqrt(n); the sample sd ~ sigma / sqrt(2 n).
    assert abs(np.median(logs) - math.log(LONG.tool_pause_median_s)) < 5 * 1.2533 * sigma / math.sqrt(n)
    assert abs(logs.std() - sigma) < 5 * sigma / math.sqrt(2 * n)


def test_uniform_call_times_delay_the_fan_out_by_their_mean():
    # No spread and no follow-ups: a task is its parent, k sub-agent calls at
    # its done time, then the aggregation one call_s later.
    p = FanoutParams(duration_s=3000.0, task_rate=0.5, call_s=(2.0, 8.0), spread_s=0.0, rounds=(0, 0), seed=9)
    tasks = [rs for rs in families(fanout(p, SHAPE)).values() if rs[0].arrival_s < p.duration_s - 60.0]
    plans = np.array([rs[1].arrival_s - rs[0].arrival_s for rs in tasks])
    assert all(rs[1].arrival_s == rs[-2].arrival_s for rs in tasks)  # k calls at once
    results = np.array([rs[-1].arrival_s - rs[-2].arrival_s for rs in tasks])
    assert results.min() >= 2.0 and results.max() <= 8.0
    assert plans.min() >= 2.0 and plans.max() <= 8.0
    assert abs(plans.mean() - 5.0) < 5 * 6.0 / math.sqrt(12 * len(plans))


# --- seeds and validation --------------------------------------------------------------------

def test_a_seed_gives_one_workload():
    p = FanoutParams(duration_s=300.0, task_rate=0.5)
    first, again = fanout(p, SHAPE), fanout(p, SHAPE)
    other = fanout(FanoutParams(duration_s=300.0, task_rate=0.5, seed=8), SHAPE)
    assert first and first == again
    assert [r.arrival_s for r in first] != [r.arrival_s for r in other]


@pytest.mark.parametrize("kwargs, field_name", [
    ({"duration_s": 0.0}, "duration_s"),
    ({"task_rate": -1.0}, "task_rate"),
    ({"task_rate": math.inf}, "task_rate"),
    ({"tool_pause_median_s": 0.0}, "tool_pause_median_s"),
    ({"tool_pause_sigma": -0.1}, "tool_pause_sigma"),
    ({"spread_s": -1.0}, "spread_s"),
    ({"context_blocks": (5, 2)}, "context_blocks"),
    ({"context_blocks": (-1, 2)}, "context_blocks"),
    ({"context_blocks": (1.5, 2)}, "context_blocks"),
    ({"call_s": (3.0,)}, "call_s"),
    ({"call_s": (-1.0, 2.0)}, "call_s"),
    ({"subagents": (0, 3)}, "subagents"),
    ({"subagents": [3, 5]}, "subagents"),  # a list is not a frozen pair: scenarios.py makes it a tuple
    ({"rounds": (2, 1)}, "rounds"),
])
def test_bad_parameters_are_refused_naming_the_field(kwargs, field_name):
    with pytest.raises(ValueError, match=rf"FanoutParams\.{field_name} must"):
        FanoutParams(**kwargs)


# --- the committed scenario ------------------------------------------------------------------

def test_the_agent_fanout_scenario_loads_and_its_requests_are_sorted():
    scenario = get_scenario("agent-fanout", seed=5, block_tokens=512)
    assert isinstance(scenario.params, FanoutParams) and scenario.generator == "fanout"
    assert scenario.params.seed == 5 and scenario.shape.block_tokens == 512
    assert scenario.params.duration_s == 3600.0 and "ASSUMED" in scenario.note
    requests = scenario.requests()
    times = [r.arrival_s for r in requests]
    assert times == sorted(times) and times[-1] < 3600.0
    assert all(r.block_tokens == 512 and r.family.startswith("fan-") for r in requests)
    # The mean request rate the note sizes the load by: ~13.9 requests per task.
    per_task = len(requests) / len({r.family for r in requests})
    assert 12.5 < per_task < 15.0 and 11.0 < len(requests) / 3600.0 < 14.5
    described = scenario.describe()
    assert described["scenario"] == "agent-fanout" and described["generator"] == "FanoutParams"
    for name in ("task_rate", "context_blocks", "call_s", "subagents", "spread_s", "rounds",
                 "tool_pause_median_s", "tool_pause_sigma", "seed", "duration_s"):
        assert described[name] == getattr(scenario.params, name)
    assert described["families"]["prefix_blocks"] == scenario.shape.prefix_blocks


def test_announced_follow_ups_name_the_sub_agents_and_the_tool_calls(whole_tasks):
    for task in whole_tasks:
        assert task.parent.follow_ups == len(task.lineages)  # the plan names its sub-agents
        for lineage in task.lineages:
            # every call but a sub-agent's last ended in a tool call: it comes back
            assert [c.follow_ups for c in lineage] == [1] * (len(lineage) - 1) + [0]
        assert task.aggregation is not None and task.aggregation.follow_ups == 0


def test_the_public_trace_records_announce_nothing():
    assert TraceRequest(0.0, 10, 1, (1,), 16, "f").follow_ups == 0
