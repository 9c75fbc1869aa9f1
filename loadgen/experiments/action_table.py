"""The per-action table of a comparison: which speculative action paid.

One row per (policy, action kind) that issued orders: how many, their bytes
(network bytes of replicas; promoted bytes of prefetches), what they came to
(services/scheduler/replication/outcomes.py: used in time, used late, never
used, cancelled, failed), how many had none yet when the totals were read
(pending: lease still running or not yet run; a live run reads them at its
drain, so a retain's 300 s lease is pending there), the share of the decided
orders' bytes read in time, the share read
after the lease by a later request on the order's node (what it placed
outlives its lease until evicted; outcomes.py), and the TTFT the
planner expected them to save, in all and for those used in time. Expected,
not measured: the measured effect of a policy is its rows in the main table
against `none`'s. The `forecast` column names the forecasts the orders were
bought for (burst, return, retention; "none" for orders no forecast drove);
an action bought for more than one gets a row per forecast below its total,
so the table says which forecast's orders were read.
"""
from __future__ import annotations

from typing import Mapping

from speckv.loadgen.experiments.results import PolicySummary
from speckv.services.scheduler.replication.outcomes import OUTCOME_NAMES


def action_table(policies: Mapping[str, PolicySummary]) -> str:
    """Markdown; empty when no policy issued an order."""
    lines = ["| policy | action | forecast | orders | GiB | " + " | ".join(o.replace("_", " ") for o in OUTCOME_NAMES)
             + " | pending | bytes read in time | bytes read after lease | expected s | expected s (used in time) |",
             "|---|---|---|" + "---:|" * (len(OUTCOME_NAMES) + 7)]
    rows = 0
    for name, summary in policies.items():
        for kind, stats in sorted((summary.actions or {}).items()):
            split = stats.get("by_forecast") or {}
            lines.append(_row(name, kind, ", ".join(map(_forecast_name, split)) or "-", stats))
            if len(split) > 1:
                lines += [_row(name, kind, _forecast_name(forecast), part) for forecast, part in split.items()]
            rows += 1
    return "\n".join(lines) if rows else ""


def _row(policy: str, kind: str, forecast: str, stats: Mapping) -> str:
    outcomes = stats["outcomes"]
    expected = stats["expected_ms_by_outcome"]
    share = stats["bytes_used_in_time_share"]
    decided = sum(stats["bytes_by_outcome"].values())
    after = f"{stats.get('bytes_read_after_lease', 0) / decided:.3f}" if decided else "-"
    pending = stats.get("pending_orders", "-")  # result files from before it was written have none
    return (f"| {policy} | {kind} | {forecast} | {stats['orders']} | {stats['bytes'] / 2**30:.2f} | "
            + " | ".join(str(outcomes[o]) for o in OUTCOME_NAMES)
            + f" | {pending} | {'-' if share is None else f'{share:.3f}'} | {after} | "
            f"{stats['expected_ms'] / 1e3:.1f} | {expected['used_in_time'] / 1e3:.1f} |")


def _forecast_name(forecast: str) -> str:
    return forecast or "none"
