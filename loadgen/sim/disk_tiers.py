"""`speckv simulate --disk-blocks 0,N`: each policy with and without the
disk tier on the same requests, and the intervals of issue 44's verdicts.

A trace is one realization (`--seeds` draws realizations of a synthetic
scenario only), so a trace verdict's interval is a paired bootstrap over
the slice's requests (bootstrap.py): every simulation draws the same
requests in every draw (request-id order, a fixed seed), so the ratio of
two runs' figures draw by draw (paired_ratio_intervals) leaves out which
requests the slice happened to hold, which both share. Each row gives its
returning p99 and reuse recovered with their own 95 % intervals, and two
ratios of the returning p99 with theirs: against the same policy with the
first disk size (`--disk-blocks 0,...`: without the disk tier) and against
`none` with the same disk size. A ratio whose interval holds 1 is a tie.

What the intervals leave out: a deterministic simulation has no
run-to-run noise of its own, but a small change (an order issued or not)
moves the runs' later routes apart; that spread is not in a bootstrap over
requests, nor is how much higher the p99 of few requests could be
(bootstrap_draws says why). A verdict just inside its target is a hint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from speckv.loadgen.experiments.bootstrap import BootstrapDraws, intervals_of, paired_ratio_intervals
from speckv.loadgen.sim.jobs import SimulationResult

P99 = "returning_ttft_p99_ms"
RECOVERED = "reuse_recovered_ratio"
BASELINE = "none"

Interval = tuple[float, float]


@dataclass(frozen=True, slots=True)
class DiskTierRow:
    """One policy at one node count and disk size (disk_blocks 0: no disk
    tier); ratios are of the returning p99, with their paired 95 % intervals
    (None: no baseline run, or not drawn from the same requests)."""

    nodes: int
    policy: str
    disk_blocks: int
    reuse_recovered: float | None
    reuse_recovered_ci95: Interval | None
    returning_p99_ms: float | None
    returning_p99_ci95: Interval | None
    vs_first_disk: float | None
    vs_first_disk_ci95: Interval | None
    vs_none: float | None
    vs_none_ci95: Interval | None

    def to_json(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__slots__}


def disk_tier_rows(results: Sequence[SimulationResult], disks: Sequence[int]) -> list[DiskTierRow]:
    """A row per result of disks' sizes, by node count, policy, then disks' order."""
    by = {(r.nodes, r.policy, r.disk_pages or 0): r for r in results}
    policies = list(dict.fromkeys(r.policy for r in results))
    rows = []
    for nodes in sorted({r.nodes for r in results}):
        for policy in policies:
            for disk in disks:
                me = by.get((nodes, policy, disk))
                if me is None:
                    continue
                own = intervals_of(me.draws) if me.draws is not None else {}
                first = _ratio(me, by.get((nodes, policy, disks[0])))
                base = _ratio(me, by.get((nodes, BASELINE, disk)))
                rows.append(DiskTierRow(nodes, policy, disk, me.summary.reuse_recovered_ratio, own.get(RECOVERED),
                                        me.summary.returning_ttft_p99_ms, own.get(P99), *first, *base))
    return rows


def _ratio(me: SimulationResult, other: SimulationResult | None) -> tuple[float | None, Interval | None]:
    """me's returning p99 over other's, and the paired interval of that ratio."""
    if other is None or other is me:
        return None, None
    mine, theirs = me.summary.returning_ttft_p99_ms, other.summary.returning_ttft_p99_ms
    if mine is None or not theirs:
        return None, None
    interval = None
    if me.draws is not None and other.draws is not None:
        interval = paired_ratio_intervals(_only(me.draws), _only(other.draws)).get(P99)
    return mine / theirs, interval


def _only(draws: BootstrapDraws) -> BootstrapDraws:
    return BootstrapDraws(draws.key, {P99: draws.values[P99]} if P99 in draws.values else {})


def disk_tier_table(rows: Sequence[DiskTierRow]) -> str:
    """A markdown table of the rows."""
    lines = ["| nodes | policy | disk blocks | reuse recovered [95 %] | returning p99 ms [95 %] "
             "| p99 / first disk size [95 %] | p99 / none's [95 %] |", "|---:|---|---:|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.nodes} | {r.policy} | {r.disk_blocks:,} | {_pct(r.reuse_recovered, r.reuse_recovered_ci95)} "
                     f"| {_ms(r.returning_p99_ms, r.returning_p99_ci95)} | {_x(r.vs_first_disk, r.vs_first_disk_ci95)} "
                     f"| {_x(r.vs_none, r.vs_none_ci95)} |")
    return "\n".join(lines)


def _pct(value: float | None, ci: Interval | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1%}" + (f" [{ci[0]:.1%}, {ci[1]:.1%}]" if ci else "")


def _ms(value: float | None, ci: Interval | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" + (f" [{ci[0]:,.0f}, {ci[1]:,.0f}]" if ci else "")


def _x(value: float | None, ci: Interval | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}x" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
