"""Agent fan-out: a lead agent plans, spawns sub-agents that share its whole
prompt, each sub-agent calls tools and comes back, and the lead aggregates.

The process (one seeded NumPy Generator draws everything, in the order
below, so a seed gives one workload):
- Tasks: parent requests arrive as a Poisson process of rate `task_rate`
  per second over [0, duration_s). Each picks an agent template t with the
  Zipf(shape.zipf_s) popularity of the other generators (synthetic.py's
  family picking): t's prefix is `shape.prefix_blocks` blocks (its system
  prompt and tool definitions), the same ids for every task of t.
- Parent: template prefix + the task's own context, uniform
  `context_blocks` (lo, hi) blocks of fresh ids. It is done (planned)
  `call_s` (uniform lo, hi) seconds after its arrival.
- Fan-out: at done the parent spawns k sub-agents, k uniform in `subagents`
  (lo, hi). Sub-agent j arrives at done + U(0, spread_s); its prompt is the
  parent's WHOLE prompt (the same ids: template and task context) plus its
  own instructions, 1..shape.max_suffix_blocks fresh blocks.
- Tool rounds: each sub-agent then makes r follow-up calls, r uniform in
  `rounds` (lo, hi). Call i+1 arrives when call i is done (call_s after it
  arrived) plus a tool pause, lognormal with median `tool_pause_median_s`
  and log-space sigma `tool_pause_sigma`; its prompt is call i's prompt
  (the same ids) plus the tool's result and call i's output,
  1..shape.max_suffix_blocks fresh blocks: the sub-agent's chain grows.
- Aggregation: when the last sub-agent's last call is done, the parent
  makes one more request: its own prompt (the same ids) plus one fresh
  block per sub-agent (its condensed result).
- Announced follow-ups (TraceRequest.follow_ups, what an agent framework
  knows and a router can report with the turn's end): the parent's is k
  (its plan names its sub-agents), a sub-agent call that ends in a tool
  call has 1 (it comes back with the tool's result), every other call 0.
  Set after the draws: a seed gives the same requests as before it was.
Every prompt ends in a partial block (1..block_tokens - 1 tokens past its
last full one, as in synthetic.py); output tokens are uniform in
shape.output_tokens. Arrivals at or past duration_s are dropped (a task
that starts near the end is cut short); the list is in arrival order.

Block ids: template t owns ids t x prefix_blocks + 1 .. (t + 1) x
prefix_blocks, as in synthetic.py; every fresh block takes the next id of
one counter starting after the last template id, so no two requests share
a block unless one's prompt extends the other's (chained ids: sharing the
id at position i means sharing the prefix through block i).

Family = the task, named fan-<template>-<task> (task = the parent's index in
arrival order), not the template. The scheduler forecasts and replicates per
family, and a family's chain is the common prefix of its requests
(services/scheduler/families.py): with one family per task that chain is the
parent's whole prompt, template plus task context, which is exactly what the
k sub-agents, their follow-ups and the aggregation all start with, and the
family's arrivals are the burst (one parent, then k calls within spread_s a
plan later) that a forecaster can see coming. With one family per template
the chain would be the template prefix only (the task context, which every
sub-agent also needs, would never be replicated) and the family's arrivals a
smooth Poisson mix of many tasks that hides the fan-out. The template stays
shared through its block ids (a route still finds its prefix anywhere) and
its id stays in the family name.

Sources (services/config/scenarios.json, agent-fanout, gives the figures
and which of them are ASSUMED): Anthropic, "How we built our multi-agent
research system" (engineering blog, June 2025: a lead agent plans, spawns
3-5 sub-agents in parallel, each using 3+ tools in parallel; 1 sub-agent
with 3-10 tool calls for fact-finding, 2-4 with 10-15 calls each for
comparisons; sub-agents condense their findings for the lead); Continuum
(arXiv 2511.02230: tool calls pause an agent's LLM calls for milliseconds
to tens of seconds in SWE-bench / BFCL traces, and it pins KV across them
with a TTL); KVFlow (arXiv 2507.07400: multi-agent workflows re-invoke
agents whose fixed prompts are prefix-cached, and LRU evicts them shortly
before reuse); Autellix (arXiv 2502.13965: agent programs are DAGs of LLM
calls and tool or human interrupts); Parrot (OSDI'24: map-reduce style
applications whose parallel requests share a common prompt prefix).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from speckv.loadgen.workload.synthetic import FamilyShape, _Families
from speckv.services.common.traces import TraceRequest


def _check_range(name: str, value: object, low: float, integer: bool) -> None:
    """value must be a (lo, hi) pair with low <= lo <= hi (ints when integer)."""
    kind = int if integer else (int, float)
    if (not isinstance(value, tuple) or len(value) != 2
            or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value)):
        raise ValueError(f"FanoutParams.{name} must be a ({'int' if integer else 'number'}) pair (lo, hi), "
                         f"not {value!r}")
    lo, hi = value
    if not low <= lo <= hi or not math.isfinite(hi):
        raise ValueError(f"FanoutParams.{name} must satisfy {low:g} <= lo <= hi, not {value!r}")


@dataclass(frozen=True, slots=True)
class FanoutParams:
    duration_s: float = 3600.0
    task_rate: float = 0.9  # parent tasks per second (Poisson)
    context_blocks: tuple[int, int] = (2, 8)  # the task's own context, fresh blocks, uniform
    call_s: tuple[float, float] = (2.0, 8.0)  # a call's arrival to done (the parent's planning too), uniform
    subagents: tuple[int, int] = (3, 5)  # k sub-agents per task, uniform
    spread_s: float = 1.0  # sub-agents arrive within this many seconds of the parent's done
    rounds: tuple[int, int] = (1, 3)  # follow-up calls per sub-agent, uniform
    tool_pause_median_s: float = 4.0  # tool pause before each follow-up: lognormal median
    tool_pause_sigma: float = 0.8  # ... and its sigma in log space
    seed: int = 7

    def __post_init__(self) -> None:
        for name in ("duration_s", "task_rate", "tool_pause_median_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"FanoutParams.{name} must be a finite number > 0, not {value!r}")
        for name in ("spread_s", "tool_pause_sigma"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"FanoutParams.{name} must be a finite number >= 0, not {value!r}")
        _check_range("context_blocks", self.context_blocks, 0, integer=True)
        _check_range("call_s", self.call_s, 0.0, integer=False)
        _check_range("subagents", self.subagents, 1, integer=True)
        _check_range("rounds", self.rounds, 0, integer=True)


def describe(params: FanoutParams, shape: FamilyShape) -> dict[str, object]:
    """Parameters for the report (the same layout as synthetic.describe)."""
    return {"generator": type(params).__name__, **asdict(params), "families": asdict(shape)}


class _Builder:
    """Requests of one workload: fresh block ids from one counter, the
    partial last block and output length drawn for each request."""

    def __init__(self, shape: FamilyShape, rng: np.random.Generator) -> None:
        self.shape, self._rng = shape, rng
        self._next_hash = shape.families * shape.prefix_blocks + 1

    def template(self, t: int) -> tuple[int, ...]:
        n = self.shape.prefix_blocks
        return tuple(range(t * n + 1, (t + 1) * n + 1))

    def fresh(self, n: int) -> tuple[int, ...]:
        first = self._next_hash
        self._next_hash += n
        return tuple(range(first, first + n))

    def suffix_blocks(self) -> int:
        return int(self._rng.integers(1, self.shape.max_suffix_blocks + 1))

    def request(self, t: float, hashes: tuple[int, ...], family: str) -> TraceRequest:
        s = self.shape
        tail = int(self._rng.integers(1, s.block_tokens))  # a partial last block
        out = int(self._rng.integers(s.output_tokens[0], s.output_tokens[1] + 1))
        return TraceRequest(t, len(hashes) * s.block_tokens + tail, out, hashes, s.block_tokens, family)


def fanout(params: FanoutParams, shape: FamilyShape = FamilyShape()) -> list[TraceRequest]:
    """The agent fan-out workload (module docstring), in arrival order."""
    p = params
    rng = np.random.default_rng(p.seed)
    templates = _Families(shape, rng)  # only its Zipf pick: ids are the builder's
    build = _Builder(shape, rng)
    pause_mu = math.log(p.tool_pause_median_s)

    def call_s() -> float:
        return float(rng.uniform(p.call_s[0], p.call_s[1]))

    def uniform_int(pair: tuple[int, int]) -> int:
        return int(rng.integers(pair[0], pair[1] + 1))

    n_tasks = int(rng.poisson(p.task_rate * p.duration_s))
    starts = np.sort(rng.uniform(0.0, p.duration_s, n_tasks))
    out: list[TraceRequest] = []
    for task, start in enumerate(starts.tolist()):
        t = templates.pick()
        family = f"fan-{t}-{task}"
        parent = build.template(t) + build.fresh(uniform_int(p.context_blocks))
        calls = [build.request(start, parent, family)]
        done = start + call_s()
        last_done = done
        k = uniform_int(p.subagents)
        calls[0] = replace(calls[0], follow_ups=k)  # the lead's plan names its sub-agents
        for _ in range(k):
            at = done + float(rng.uniform(0.0, p.spread_s))
            chain = parent + build.fresh(build.suffix_blocks())
            calls.append(build.request(at, chain, family))
            for _ in range(uniform_int(p.rounds)):
                at += call_s() + float(rng.lognormal(pause_mu, p.tool_pause_sigma))
                chain += build.fresh(build.suffix_blocks())
                calls[-1] = replace(calls[-1], follow_ups=1)  # it ended in a tool call: the agent comes back
                calls.append(build.request(at, chain, family))
            last_done = max(last_done, at + call_s())
        calls.append(build.request(last_done, parent + build.fresh(k), family))
        out.extend(r for r in calls if r.arrival_s < p.duration_s)
    out.sort(key=lambda r: r.arrival_s)
    return out
