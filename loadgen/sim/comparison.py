"""The simulated comparison: the simulations' results gathered into one
Comparison (the shape of `bench e2e`'s, for the largest node count, with
every node count's row), its console tables and its reports."""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from rich.table import Table

from speckv.loadgen.experiments.action_table import action_table
from speckv.loadgen.experiments.bootstrap import with_paired_intervals
from speckv.loadgen.experiments.e2e_config import E2EConfig
from speckv.loadgen.experiments.event_table import event_table, nodes_needed_line, utilisation_table
from speckv.loadgen.experiments.repeats import repeat_figures, repeats_table
from speckv.loadgen.experiments.report import BASELINE, console_tables, fmt, markdown_table, versus, write_report
from speckv.loadgen.experiments.results import (
    NODES_NEEDED_ATTAINMENT,
    Comparison,
    PolicySummary,
    ScaleRow,
    SimulatedTotals,
    figure_of,
    with_avoidable_closed,
)
from speckv.loadgen.sim.ablation import AblationRow, RunFigures, ablation_rows, ablation_table
from speckv.loadgen.sim.jobs import SimulationResult
from speckv.services.scheduler.policies.registry import FORECAST_POLICIES


def assemble(results: list[SimulationResult], args: argparse.Namespace, config: E2EConfig,
             machine: dict[str, object]) -> Comparison:
    """The comparison at the largest node count, with every count under by_nodes."""
    ordered = sorted(results, key=lambda r: (r.nodes, args.policy_list.index(r.policy)))
    by_nodes: dict[str, ScaleRow] = {}
    for r in ordered:
        row = by_nodes.setdefault(str(r.nodes), ScaleRow({}, r.requests_in_slice, [], r.floor))
        row.policies[r.policy] = r.summary
        row.notes.extend(note for note in r.notes if note not in row.notes)  # a policy's own notes too (LightGBM)
    for n, row in by_nodes.items():
        draws = {r.policy: r.draws for r in ordered if str(r.nodes) == n and r.draws is not None}
        row.policies.update(with_paired_intervals(with_avoidable_closed(row.policies, row.floor), draws))
    # The largest node count's row, taken in policy order: the order the
    # workers finished in must not choose what the top level says.
    top = next(r for r in ordered if r.nodes == ordered[-1].nodes)
    top_row = by_nodes[str(top.nodes)]
    predictor = next((r.predictor for r in results if r.policy in FORECAST_POLICIES),
                     "not run (no policy here reads forecasts)")
    costs = [r.summary.simulated for r in results if r.summary.simulated is not None]
    total_cpu = sum(c.cpu_s for c in costs)
    total_events = sum(c.simulated_events for c in costs)
    totals = SimulatedTotals(wall_s=args.wall_s, simulated_events=total_events,
                             code=",".join(sorted({r.code for r in results})), cpu_s=total_cpu,
                             events_per_s=total_events / total_cpu if total_cpu else None,
                             peak_rss_mb=max(c.peak_rss_mb for c in costs), by_nodes=by_nodes, machine=machine,
                             load_nodes=getattr(args, "load_nodes", None))
    host_pages = config.host_pages if args.host_pages is None else args.host_pages
    host = (f"each node has a host tier of {host_pages} blocks ({host_pages * config.real_bytes_per_block / 2**30:.1f} "
            f"GiB) below its device tier, promoted over a {config.host_link.gbps:g} Gbit/s host link"
            if host_pages and config.host_link else "no host tier (device tier only)")
    return Comparison(
        trace=Path(args.trace).name if args.trace else f"synthetic:{args.synthetic}", slice=top.slice,
        ttft_target_ms=config.ttft_target_ms, byte_scale_factor=1, nodes=top.nodes,
        engine_profile=config.profile.name, link_gbps=config.link.gbps,
        real_bytes_per_block=config.real_bytes_per_block, burst_seconds_in_trace=top.burst_seconds,
        policies=top_row.policies, floor=top_row.floor,
        notes=[*top_row.notes, f"Simulated in virtual time (speckv simulate): predictor {predictor}, run only in the "
               f"simulations of the policies that read its forecasts ({', '.join(sorted(FORECAST_POLICIES))}); "
               "bytes are the real model's (no scaling in simulation); transfers share each node's "
               f"{config.link.gbps:g} Gbit/s link (processor sharing), {config.link.overhead_ms:g} ms each; {host}."],
        simulated=totals, host_pages=host_pages)


def scale_table(comparison: Comparison) -> str:
    """Burst p99 and bytes replicated per policy against node count, as Markdown."""
    rows = _rows(comparison)
    policies = list(next(iter(rows.values())).policies)
    lines = ["| nodes | " + " | ".join(f"{p} burst p99 ms" for p in policies) + " | floor burst p99 ms | "
             + " | ".join(f"{p} GiB replicated" for p in policies) + " |",
             "|---:|" + "---:|" * (2 * len(policies) + 1)]
    for n, row in rows.items():
        ps = row.policies
        floor = figure_of(row.floor, "burst_ttft_p99_ms")
        lines.append(f"| {n} | " + " | ".join(fmt("burst_ttft_p99_ms", ps[p].burst_ttft_p99_ms) for p in policies)
                     + f" | {fmt('burst_ttft_p99_ms', floor)} | "
                     + " | ".join(fmt("bytes_replicated", ps[p].bytes_replicated) for p in policies) + " |")
    return "\n".join(lines)


def ablation_of(results: Sequence[SimulationResult]) -> list[AblationRow]:
    """What each action measurably saved, from the `-without-ACTION` runs among results (ablation.py)."""
    return ablation_rows([RunFigures(r.nodes, r.policy, r.ttfts, r.summary.actions, r.summary.returning_ttft_p99_ms)
                          for r in results])


def write_reports(comparison: Comparison, results: list[SimulationResult], out: Path, console) -> None:
    """One HTML report per node count, scale.md and the whole result.json."""
    out.mkdir(parents=True, exist_ok=True)
    for n in _rows(comparison):
        mine = [r for r in results if str(r.nodes) == n]
        arrivals: list[tuple[float, str]] = next((r.arrivals for r in mine if r.arrivals), [])
        index = write_report(out / f"nodes-{n}", comparison.at_nodes(n), {r.policy: r.ttfts for r in mine},
                             {r.policy: r.timeline for r in mine}, arrivals, ablation_table(ablation_of(mine)))
        console.print(f"report ({n} nodes): {index}")
    (out / "scale.md").write_text(scale_table(comparison) + "\n")
    (out / "result.json").write_text(json.dumps(comparison.to_json(), indent=2))


def with_seed_repeats(comparison: Comparison, results: list[SimulationResult], seeds: list[int]) -> None:
    """With more than one seed: every policy's summary at every node count
    gets `repeats`, its figures on each seed in `seeds` order (the summary's
    own, the first seed's, first). In place: the top-level policies are the
    largest count's row."""
    if len(seeds) < 2:
        return
    for n, row in _rows(comparison).items():
        for policy, summary in list(row.policies.items()):
            by_seed = {r.seed: r.summary for r in results if str(r.nodes) == n and r.policy == policy}
            row.policies[policy] = replace(summary, repeats=repeat_figures([by_seed[s] for s in seeds]))


def print_seed_tables(comparison: Comparison, seeds: list[int], console) -> None:
    """Per node count: each figure per seed, then the between-seeds table."""
    for n, row in _rows(comparison).items():
        lines = [f"| policy | figure | {' | '.join(f'seed {s}' for s in seeds)} |", "|---|---|" + "---:|" * len(seeds)]
        for policy, summary in row.policies.items():
            for figure in ("burst_ttft_p99_ms", "returning_ttft_p99_ms", "ttft_p50_ms"):
                values = (summary.repeats or {}).get(figure)
                if values and len(values) == len(seeds):
                    lines.append(f"| {policy} | {figure} | " + " | ".join(f"{v:.0f}" for v in values) + " |")
        console.print(f"per seed, {n} nodes (the tables above are seed {seeds[0]}'s):\n" + "\n".join(lines),
                      markup=False)
        between = repeats_table(row.policies)
        if between:
            console.print(f"between {len(seeds)} seeds, {n} nodes (repeats.py: mean, difference from none's mean, "
                          f"95 % Welch interval; a tie holds 0):\n{between}", markup=False)


def print_tables(comparison: Comparison, console) -> None:
    for n, row in _rows(comparison).items():
        base = row.policies.get(BASELINE)
        verdicts = {name: [_verdict_cell(name, m, base)] for name, m in row.policies.items()}
        for table in console_tables(f"simulated, {n} nodes (TTFT in real-model ms)", row.policies, row.floor,
                                    verdicts, ("burst p99 vs none",)):
            console.print(table)
        console.print(_cost_table(f"simulated, {n} nodes: what each simulation cost", row.policies))
        console.print(markdown_table(row.policies, row.floor), markup=False)
        actions = action_table(row.policies)
        if actions:
            console.print(f"speculative actions, {n} nodes:\n{actions}", markup=False)
        for title, table in ((f"utilisation, {n} nodes (utilisation.py)", utilisation_table(row.policies)),
                             (f"node events, {n} nodes (event_metrics.py)", event_table(row.policies))):
            if table:
                console.print(f"{title}:\n{table}", markup=False)
    console.print(scale_table(comparison), markup=False)
    sim = comparison.simulated
    assert sim is not None
    needed = nodes_needed_line(sim.nodes_needed(), sorted(map(int, sim.by_nodes)), NODES_NEEDED_ATTAINMENT,
                               sim.load_nodes)
    if needed:
        console.print(needed, markup=False)


def _verdict_cell(name: str, summary: PolicySummary, baseline: PolicySummary | None) -> str:
    """Burst p99 against `none`'s: the change, then "tie" where the paired
    bootstrap interval of the difference holds 0 (which requests the slice holds
    is one draw, even in a deterministic simulation), else better or worse."""
    if baseline is None:
        return "-"
    return "baseline" if name == BASELINE else versus(summary, baseline)


def _cost_table(title: str, policies: dict[str, PolicySummary]) -> Table:
    table = Table(title=title)
    for name in ("policy", "wall s", "CPU s", "events/CPU s", "peak MiB"):
        table.add_column(name, justify="left" if name == "policy" else "right")
    for name, summary in policies.items():
        table.add_row(name, *_cost_cells(summary))
    return table


def _cost_cells(summary: PolicySummary) -> list[str]:
    cost = summary.simulated
    if cost is None:
        return ["", "", "", ""]
    return [f"{cost.wall_s:.1f}", f"{cost.cpu_s:.1f}", f"{cost.events_per_s:.0f}" if cost.events_per_s else "-",
            f"{cost.peak_rss_mb:.0f}"]


def _rows(comparison: Comparison) -> dict[str, ScaleRow]:
    if comparison.simulated is None:
        raise ValueError("not a simulated comparison")
    return comparison.simulated.by_nodes
