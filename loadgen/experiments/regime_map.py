"""The regime map: where speculation pays, per link and engine profile
(`speckv simulate --sweep ...`).

One MapCell per (cell, node count): each policy's figures that placement can
and cannot change (returning and first-seen p99, burst p99, reuse recovered,
avoidable latency closed), and each policy's gain over `none`.

Gain = (none - policy) / none of a TTFT figure: the share of `none`'s p99 a
policy takes away (0.05: 5 % lower; negative: worse). The heat map's colour
is the gain of the best policy that is neither `none` nor an oracle, on the
headline figure: the burst-window p99 (HEADLINE_FIGURE, the figure the
demo's verdict is on, report.VERDICT_FIGURE); a second map shows the
returning-request p99, the figure placement acts on. The oracle's gain is
written beside it in every cell; below ORACLE_PAYS_MIN_GAIN the cell says the
oracle does not pay there: not even perfect foresight moves that figure.

Rows of the map are links, columns engine profiles (models); a key that was
not swept has the base configuration's value as its one row or column.
"""
from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from rich.table import Table  # noqa: E402

from speckv.loadgen.experiments.report import VERDICT_FIGURE, fmt  # noqa: E402
from speckv.loadgen.experiments.results import FloorSummary, PolicySummary, figure_of  # noqa: E402

HEADLINE_FIGURE = VERDICT_FIGURE  # burst_ttft_p99_ms
GAIN_FIGURES = (("burst_ttft_p99_ms", "burst p99"), ("returning_ttft_p99_ms", "returning p99"))
MAP_FIGURES = (("returning_ttft_p99_ms", "returning p99 ms"), ("first_seen_ttft_p99_ms", "first-seen p99 ms"),
               ("burst_ttft_p99_ms", "burst p99 ms"), ("reuse_recovered_ratio", "reuse recovered"),
               ("avoidable_closed", "avoidable closed"))
BASELINE = "none"
ORACLE = "oracle"
# The DESIGN's bar for "moved" in the first comparison: under 1 % of none's
# p99, the oracle's placement changed nothing a user would see.
ORACLE_PAYS_MIN_GAIN = 0.01


def gain(policies: Mapping[str, PolicySummary], policy: str, figure: str) -> float | None:
    """(none - policy) / none of `figure`; None without both figures or with none's at 0."""
    base, mine = figure_of(policies.get(BASELINE), figure), figure_of(policies.get(policy), figure)
    if not isinstance(base, (int, float)) or not isinstance(mine, (int, float)) or base <= 0:
        return None
    return (base - mine) / base


def gain_key(figure: str) -> str:
    """The JSON key of a figure's gain: burst_ttft_p99_ms -> burst_gain."""
    return f"{figure.removesuffix('_ttft_p99_ms')}_gain"


def is_candidate(policy: str) -> bool:
    """A policy the map's colour may name: neither the baseline nor an oracle (or an oracle's ablation)."""
    return policy != BASELINE and not policy.startswith(ORACLE)


@dataclass(frozen=True, slots=True)
class MapCell:
    """One cell of the map at one node count. Invariant: policies holds
    every policy of the run, in the order given; link and profile name the
    cell's row and column."""

    label: str
    link: str
    profile: str
    nodes: int
    config: dict[str, dict[str, object]]  # the cell's resolved configuration (sweep.resolved_view)
    policies: dict[str, PolicySummary]
    floor: FloorSummary | None

    def best(self, figure: str) -> tuple[str, float] | None:
        """The candidate policy with the largest gain on figure (the first named on a tie), whether or
        not it beats none (winner_text says); None: no candidate."""
        scored = [(p, g) for p in self.policies if is_candidate(p) for g in [gain(self.policies, p, figure)]
                  if g is not None]
        return max(scored, key=lambda pg: pg[1]) if scored else None

    def oracle_gain(self, figure: str) -> float | None:
        return gain(self.policies, ORACLE, figure) if ORACLE in self.policies else None

    def oracle_pays(self, figure: str) -> bool | None:
        """Whether the oracle's gain reaches ORACLE_PAYS_MIN_GAIN; None: no oracle ran (or no figure)."""
        g = self.oracle_gain(figure)
        return None if g is None else g >= ORACLE_PAYS_MIN_GAIN

    def to_json(self) -> dict[str, object]:
        policies = {p: {**{k: figure_of(s, k) for k, _ in MAP_FIGURES},
                        **{gain_key(k): gain(self.policies, p, k) for k, _ in GAIN_FIGURES}}
                    for p, s in self.policies.items()}
        best = {k: (None if b is None else {"policy": b[0], "gain": b[1], "beats_none": b[1] > 0})
                for k, _ in GAIN_FIGURES
                for b in [self.best(k)]}
        oracle = {k: {"gain": self.oracle_gain(k), "pays": self.oracle_pays(k)} for k, _ in GAIN_FIGURES}
        return {"cell": self.label, "link": self.link, "profile": self.profile, "nodes": self.nodes,
                "policies": policies, "floor": self.floor.to_json() if self.floor else None,
                "best": best, "oracle": oracle, "config": self.config}


@dataclass(frozen=True, slots=True)
class RegimeMap:
    """Every cell at every node count; links and profiles in the order swept."""

    swept: dict[str, list[str]]
    links: list[str]
    profiles: list[str]
    cells: list[MapCell]

    def node_counts(self) -> list[int]:
        return sorted({c.nodes for c in self.cells})

    def at(self, link: str, profile: str, nodes: int) -> MapCell | None:
        return next((c for c in self.cells if (c.link, c.profile, c.nodes) == (link, profile, nodes)), None)

    def to_json(self) -> dict[str, object]:
        return {"swept": self.swept, "links": self.links, "profiles": self.profiles,
                "headline_figure": HEADLINE_FIGURE,
                "gain": "(none - policy) / none of the figure: the share of none's p99 the policy takes away",
                "best_policy": "the largest gain among policies other than none and the oracle",
                "oracle_pays_min_gain": ORACLE_PAYS_MIN_GAIN,
                "cells": [c.to_json() for c in self.cells]}


def pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 100:+.1f} %"


def winner_text(best: tuple[str, float] | None) -> str:
    """The best candidate and its gain; `none` when no candidate beats it (a tie is no win)."""
    if best is None:
        return "no policy but none"
    return f"{best[0]} {pct(best[1])}" if best[1] > 0 else f"none wins (best other {pct(best[1])})"


def cell_verdict(cell: MapCell, figure: str = HEADLINE_FIGURE) -> str:
    """One line: the winning policy and its gain, the oracle's beside it."""
    text = winner_text(cell.best(figure))
    pays = cell.oracle_pays(figure)
    if pays is None:
        return f"{text}; oracle not run"
    return f"{text}; oracle {pct(cell.oracle_gain(figure))}" + ("" if pays else " (oracle does not pay)")


def console_tables(regime: RegimeMap) -> list[Table]:
    """Per node count: every cell and policy with the map's figures, then the
    map itself (rows links, columns profiles) for each gain figure."""
    tables: list[Table] = []
    for n in regime.node_counts():
        table = Table(title=f"regime map, {n} nodes (TTFT in real-model ms; gain = (none - policy) / none)")
        for title in ("cell", "policy", *(t for _, t in MAP_FIGURES), *(f"{t} gain" for _, t in GAIN_FIGURES)):
            table.add_column(title, justify="left" if title in ("cell", "policy") else "right")
        for cell in (c for c in regime.cells if c.nodes == n):
            for i, (p, s) in enumerate(cell.policies.items()):
                table.add_row(cell.label if i == 0 else "", p, *(fmt(k, figure_of(s, k)) for k, _ in MAP_FIGURES),
                              *(pct(gain(cell.policies, p, k)) for k, _ in GAIN_FIGURES),
                              end_section=i == len(cell.policies) - 1)
        tables.append(table)
        for key, title in GAIN_FIGURES:
            grid = Table(title=f"{n} nodes, {title}: best policy's gain over none; the oracle's beside it")
            grid.add_column("link \\ profile")
            for profile in regime.profiles:
                grid.add_column(profile)
            for link in regime.links:
                grid.add_row(link, *(cell_verdict(c, key) if c else "-"
                                     for profile in regime.profiles for c in [regime.at(link, profile, n)]))
            tables.append(grid)
    return tables


def markdown(regime: RegimeMap) -> str:
    """The map as Markdown: per node count and gain figure, the grid; then every cell's figures."""
    out: list[str] = []
    for n in regime.node_counts():
        for key, title in GAIN_FIGURES:
            out += [f"{n} nodes, {title}: best policy (not none, not the oracle) and its gain over none; the oracle's",
                    "", "| link \\ profile | " + " | ".join(regime.profiles) + " |",
                    "|---|" + "---|" * len(regime.profiles)]
            out += [f"| {link} | " + " | ".join(cell_verdict(c, key) if c else "-" for profile in regime.profiles
                                               for c in [regime.at(link, profile, n)]) + " |"
                    for link in regime.links]
            out.append("")
        heads = [t for _, t in MAP_FIGURES] + [f"{t} gain" for _, t in GAIN_FIGURES]
        out += ["| cell | policy | " + " | ".join(heads) + " |", "|---|---|" + "---:|" * len(heads)]
        for cell in (c for c in regime.cells if c.nodes == n):
            out += [f"| {cell.label} | {p} | " + " | ".join([*(fmt(k, figure_of(s, k)) for k, _ in MAP_FIGURES),
                                                            *(pct(gain(cell.policies, p, k)) for k, _ in GAIN_FIGURES)])
                    + " |" for p, s in cell.policies.items()]
        out.append("")
    return "\n".join(out)


def heat_map(regime: RegimeMap, nodes: int, figure: str):
    """Rows links, columns profiles; colour the best candidate's gain on
    figure (diverging, 0 white; grey: no figure), text the winner, its gain
    and the oracle's."""
    grid = np.full((len(regime.links), len(regime.profiles)), np.nan)
    texts: dict[tuple[int, int], str] = {}
    reach: list[float] = []  # every gain drawn or written, so the scale shows the winner beside the oracle
    for i, link in enumerate(regime.links):
        for j, profile in enumerate(regime.profiles):
            cell = regime.at(link, profile, nodes)
            if cell is None:
                continue
            best = cell.best(figure)
            if best is not None:
                grid[i, j] = best[1]
                reach.append(abs(best[1]))
            pays = cell.oracle_pays(figure)
            if pays is not None:
                reach.append(abs(cell.oracle_gain(figure) or 0.0))
            oracle = ("oracle not run" if pays is None else
                      f"oracle {pct(cell.oracle_gain(figure))}" + ("" if pays else "\noracle does not pay"))
            head = ("-" if best is None else f"{best[0]}\n{pct(best[1])}" if best[1] > 0 else
                    f"none wins\n(best other {pct(best[1])})")
            texts[(i, j)] = f"{head}\n{oracle}"
    span = max([0.01, *reach])
    fig, ax = plt.subplots(figsize=(2.2 + 2.6 * len(regime.profiles), 1.2 + 1.3 * len(regime.links)))
    cmap = plt.get_cmap("RdBu").with_extremes(bad="lightgrey")
    image = ax.imshow(np.ma.masked_invalid(grid) * 100, cmap=cmap, vmin=-span * 100, vmax=span * 100, aspect="auto")
    for (i, j), text in texts.items():
        dark = bool(np.isfinite(grid[i, j])) and abs(grid[i, j]) > 0.6 * span
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    ax.set_xticks(range(len(regime.profiles)), regime.profiles, rotation=15, ha="right", fontsize=8)
    ax.set_yticks(range(len(regime.links)), regime.links, fontsize=8)
    ax.set_xlabel("engine profile (model, GPUs)")
    ax.set_ylabel("link (per GPU)")
    title = dict(GAIN_FIGURES).get(figure, figure)
    ax.set_title(f"{nodes} nodes: {title}, best policy's gain over none (%)", fontsize=10)
    fig.colorbar(image, ax=ax, label="gain over none, % of none's p99")
    fig.tight_layout()
    return fig


def write_report(out_dir: Path, regime: RegimeMap, heading: str, links: Mapping[str, Sequence[str]]) -> Path:
    """index.html (the heat maps, the grid and every cell's figures, links to
    each cell's own reports) and regime_map.md in out_dir; returns index.html.
    links[cell label] = paths relative to out_dir of that cell's reports."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = markdown(regime)
    (out_dir / "regime_map.md").write_text(table + "\n")
    images: list[str] = []
    for n in regime.node_counts():
        for key, title in GAIN_FIGURES:
            fig = heat_map(regime, n, key)
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
            plt.close(fig)
            (out_dir / f"regime_map_{n}_{gain_key(key)}.png").write_bytes(buffer.getvalue())
            images.append(f'<figure><img alt="{html.escape(title)}, {n} nodes" src="data:image/png;base64,'
                          f'{base64.b64encode(buffer.getvalue()).decode()}"/><figcaption>{n} nodes, '
                          f'{html.escape(title)}</figcaption></figure>')
    cell_links = "".join(f"<li>{html.escape(label)}: " + ", ".join(
        f'<a href="{html.escape(p)}">{html.escape(p)}</a>' for p in paths) + "</li>" for label, paths in links.items())
    index = out_dir / "index.html"
    index.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>speckv regime map</title><style>"
        "body{font-family:sans-serif;max-width:1100px;margin:auto}img{max-width:100%}pre{font-size:12px}</style>"
        f"</head><body><h1>speckv regime map</h1><p>{html.escape(heading)}</p>"
        f"<p>Colour: the gain over <code>none</code> of the best policy that is neither none nor the oracle, "
        f"(none - policy) / none of the p99; headline figure {HEADLINE_FIGURE} (the demo's verdict figure), and "
        "returning_ttft_p99_ms (what placement acts on) beside it. The oracle's gain is written in each cell; "
        f"below {ORACLE_PAYS_MIN_GAIN:.0%} the cell says the oracle does not pay.</p>{''.join(images)}"
        f"<h2>Every cell</h2><pre>{html.escape(table)}</pre><h2>Each cell's own report</h2><ul>{cell_links}</ul>"
        "</body></html>")
    return index
