"""The end of `speckv simulate --sweep`: the simulations' results gathered
into one comparison per cell (comparison.assemble, on the cell's own
configuration), the regime map over them (loadgen/experiments/regime_map.py),
its console tables, the JSON and the reports.

JSON: "regime_map" (RegimeMap.to_json: per cell and node count, every
policy's figures, gains, the best policy and the oracle's gain, the cell's
resolved configuration), "cells" (each cell's whole comparison, the keys of
a run without --sweep), "ablation" per cell, and the run's wall time and
machine. Report: DIR/index.html is the map; DIR/cells/<cell>/ holds each
cell's reports as a run without --sweep writes them.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Sequence

from speckv.loadgen.experiments.regime_map import MapCell, RegimeMap, console_tables, write_report
from speckv.loadgen.experiments.results import Comparison
from speckv.loadgen.sim.ablation import ablation_table
from speckv.loadgen.sim.comparison import ablation_of, assemble, write_reports
from speckv.loadgen.sim.jobs import SimulationResult
from speckv.loadgen.sim.sweep import SWEEP_KEYS, Cell, Sweep


def build_map(sweeps: Sequence[Sweep], cells: Sequence[Cell], comparisons: dict[str, Comparison]) -> RegimeMap:
    """comparisons[cell label] -> the map; rows and columns in the order swept
    (an unswept key: the base's value alone)."""
    axes = {key: list(next((s.values for s in sweeps if s.key == key), ())) or [cells[0].value(key)]
            for key in SWEEP_KEYS}
    out: list[MapCell] = []
    for cell in cells:
        sim = comparisons[cell.label].simulated
        assert sim is not None  # assemble makes simulated comparisons
        for n, row in sim.by_nodes.items():
            out.append(MapCell(cell.label, cell.value("link"), cell.value("profile"), int(n), cell.view,
                               row.policies, row.floor))
    order = {c.label: i for i, c in enumerate(cells)}
    return RegimeMap({s.key: list(s.values) for s in sweeps}, axes["link"], axes["profile"],
                     sorted(out, key=lambda c: (c.nodes, order[c.label])))


def finish_sweep(sweeps: Sequence[Sweep], cells: Sequence[Cell], results: list[SimulationResult],
                 args: argparse.Namespace, machine: dict[str, object], workers: int, console) -> int:
    """Prints the map, writes --json and --report; the exit status (1 when a
    simulation served no request, as without --sweep)."""
    comparisons = {c.label: assemble([r for r in results if r.cell == c.key], args, c.config, machine) for c in cells}
    regime = build_map(sweeps, cells, comparisons)
    for table in console_tables(regime):
        console.print(table)
    ablation = {}
    for c in cells:
        rows = ablation_of([r for r in results if r.cell == c.key])
        if rows:
            console.print(f"{c.label}: what each action measurably saved (ablation.py):\n{ablation_table(rows)}",
                          markup=False)
            ablation[c.label] = [r.to_json() for r in rows]
    events = sum(r.summary.simulated.simulated_events for r in results if r.summary.simulated is not None)
    cpu = sum(r.summary.simulated.cpu_s for r in results if r.summary.simulated is not None)
    console.print(f"wall {args.wall_s:.1f} s for {len(results)} simulations ({len(cells)} cells) in {workers} "
                  f"workers; {events} events, {cpu:.1f} CPU s; {machine['cores']} cores, reference loop "
                  f"{machine['reference_loop_ms']:.1f} ms (machine.py)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"regime_map": regime.to_json(), "cells": {k: v.to_json() for k, v in comparisons.items()},
             "ablation": ablation, "wall_s": args.wall_s, "simulations": len(results), "workers": workers,
             "machine": machine}, indent=2))
        console.print(f"JSON written to {args.json}")
    if args.report:
        out = Path(args.report)
        links: dict[str, list[str]] = {}
        for c in cells:
            folder = out / "cells" / slug(c.label)
            write_reports(comparisons[c.label], [r for r in results if r.cell == c.key], folder, console)
            links[c.label] = [str(p.relative_to(out)) for p in sorted(folder.glob("nodes-*/index.html"))]
        first = next(iter(comparisons.values()))
        heading = (f"{first.trace}, slice from {first.slice.start_s:g} s for {first.slice.duration_s:g} s; "
                   f"{len(cells)} cells, policies {', '.join(args.policy_list)}; wall {args.wall_s:.0f} s")
        console.print(f"regime map: {write_report(out, regime, heading, links)}")
    served_none = any(m.served == 0 for comp in comparisons.values() if comp.simulated
                      for row in comp.simulated.by_nodes.values() for m in row.policies.values())
    return 1 if served_none else 0


def slug(label: str) -> str:
    """A folder name for a cell label ("tcp-25g / llama-3-8b-h100" -> "tcp-25g_llama-3-8b-h100")."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", label).strip("_")
