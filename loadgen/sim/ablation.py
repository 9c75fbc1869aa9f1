"""What each speculative action measurably saved: the same simulation with
that action turned off.

A policy named `<policy>-without-<action>` (policy: predictive or oracle;
action: replicate, redundant, prefetch, stage or retain) runs `<policy>` with
that action's switch off in its policy configuration (`planner.replicate`,
`planner.redundancy`, `planner.prefetch`, `planner.stage`, `retain.enabled`), everything
else the same. The simulator is deterministic, so against `<policy>` on the
same slice and node count the difference is the action's effect, not noise:

    measured saving (ms) = sum of TTFT without the action - sum with it

over the slice's served requests (when the two runs served different
counts, the difference of their means times the count served with it),
beside the saving the planner expected when
it issued that action's orders (the sum of their `expected_benefit_ms`).
The actions interact (a retained prefix is one a prefetch may then promote),
so the savings need not add up to the policy's total. Pure.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.policy_config import PolicyConfig
from speckv.services.scheduler.orders import ActionKind

SEPARATOR = "-without-"
PLANNING_POLICIES = ("predictive", "oracle")
# The planner's switch of each action it prices (retain's is retain.enabled).
PLANNER_SWITCHES: dict[ActionKind, str] = {ActionKind.REPLICATE: "replicate", ActionKind.REDUNDANT: "redundancy",
                                           ActionKind.PREFETCH: "prefetch", ActionKind.STAGE: "stage"}


@dataclass(frozen=True, slots=True)
class Variant:
    policy: str  # the policy it runs (its orders carry this name)
    without: ActionKind | None  # the action turned off; None: the policy as configured


def parse_variant(name: str) -> Variant:
    """`predictive` -> itself; `predictive-without-retain` -> predictive
    without retain. InvalidArgument for an unknown policy or action."""
    if SEPARATOR not in name:
        return Variant(name, None)
    policy, action = name.split(SEPARATOR, 1)
    if policy not in PLANNING_POLICIES:
        raise InvalidArgument(f"policy {name!r}: only {' and '.join(PLANNING_POLICIES)} have actions to turn off")
    try:
        kind = ActionKind(action)
    except ValueError:
        raise InvalidArgument(f"policy {name!r}: unknown action {action!r} "
                              f"(expected {', '.join(k.value for k in ActionKind)})") from None
    return Variant(policy, kind)


def config_without(config: PolicyConfig, action: ActionKind) -> PolicyConfig:
    """config with action's switch off."""
    if action is ActionKind.RETAIN:
        return dataclasses.replace(config, retain=dataclasses.replace(config.retain, enabled=False))
    field = PLANNER_SWITCHES[action]
    return dataclasses.replace(config, planner=dataclasses.replace(config.planner, **{field: False}))


@dataclass(frozen=True, slots=True)
class AblationRow:
    nodes: int
    policy: str
    action: str
    orders: int  # the action's orders in the policy's run
    expected_s: float  # the saving the planner expected of them
    measured_s: float  # sum of TTFT without the action - with it
    requests: int  # served with the action
    returning_p99_ms: float | None  # with the action
    returning_p99_without_ms: float | None

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class RunFigures:
    """What ablation_rows reads of one simulation."""

    nodes: int
    policy: str
    ttfts: Sequence[float]  # per served request
    actions: dict[str, dict] | None  # PolicySummary.actions
    returning_p99_ms: float | None


def ablation_rows(runs: Sequence[RunFigures]) -> list[AblationRow]:
    """One row per variant run whose policy also ran at its node count."""
    by_key = {(r.nodes, r.policy): r for r in runs}
    rows = []
    for run in runs:
        variant = parse_variant(run.policy)
        base = by_key.get((run.nodes, variant.policy))
        if variant.without is None or base is None:
            continue
        stats = (base.actions or {}).get(variant.without.value, {})
        n = len(base.ttfts)
        measured = (float(np.mean(run.ttfts)) - float(np.mean(base.ttfts))) * n if n and len(run.ttfts) else 0.0
        rows.append(AblationRow(run.nodes, variant.policy, variant.without.value, int(stats.get("orders", 0)),
                                float(stats.get("expected_ms", 0.0)) / 1e3, measured / 1e3, n,
                                base.returning_p99_ms, run.returning_p99_ms))
    return rows


def ablation_table(rows: Sequence[AblationRow]) -> str:
    """Markdown; empty without rows."""
    if not rows:
        return ""
    lines = ["| nodes | policy | action | orders | expected s | measured s (TTFT without - with) | requests | "
             "returning p99 with | without |", "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        with_, without = (f"{v:.0f}" if v is not None else "-" for v in (r.returning_p99_ms,
                                                                          r.returning_p99_without_ms))
        lines.append(f"| {r.nodes} | {r.policy} | {r.action} | {r.orders} | {r.expected_s:.1f} | "
                     f"{r.measured_s:.1f} | {r.requests} | {with_} | {without} |")
    return "\n".join(lines)
