"""The demo's report: the verdict (a window of several bursts, simulated on
each seed; VerdictView, rendered from demo_verdict.py's rows) first, then the
live check: one short slice simulated and live side by side. The live
check's table (demo_cells) and its chart mark as a tie every figure that
is_tie (report.py) finds tied with the baseline policy's of the same kind of
run (a simulated figure: the paired interval of their difference holds 0; a
live one: their intervals overlap). Written as the comparison report is
(report.py): result.json, table.md, PNG plots (matplotlib, Agg) and one
self-contained HTML page embedding them.
"""
from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from rich import box  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

from speckv.loadgen.experiments.report import (  # noqa: E402
    BASELINE,
    FLOOR_ROW,
    HEADLINE_COLUMNS,
    LEAD_COLUMNS,
    VERDICT_FIGURE,
    fmt,
    is_tie,
    timeline_figure,
    versus,
)
from speckv.loadgen.experiments.results import Comparison, FloorSummary, PolicySummary, figure_of  # noqa: E402

# The demo's table: the figures a user reads first; the verdict is on the
# burst-window p99, the figure bursts make explode (DESIGN.md).
DEMO_COLUMNS = [("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "p99 ms"), ("burst_ttft_p99_ms", "burst p99 ms"),
                ("slo_attainment", "SLO")]
DEMO_PANELS = {"ttft_p50_ms": "TTFT p50 (ms)", "ttft_p99_ms": "TTFT p99 (ms)",
               "burst_ttft_p99_ms": "TTFT p99 in burst seconds (ms)"}
LIVE_CHECK = "Live check"
VERDICT_TITLE = "Verdict (simulated)"  # demo_verdict.DemoVerdict.headline begins with it
SIMULATED_RUN = "simulated"
LIVE_RUN = "live, 95 % CI"
TIE_MARK = "≈"
DEMO_LEGEND = (f"Live check. simulated: the deterministic simulator (loadgen/sim) on this slice at the live "
               f"replay's speed, the live check's policies, beside the live rows (the verdict is the longer "
               f"simulated window). live: the real services on this machine, one fresh cluster per policy, each "
               f"figure with its 95 % bootstrap interval over the slice's requests. {TIE_MARK}: a tie with "
               f"{BASELINE} of the same kind of run (simulated: the 95 % interval of the difference, drawn over "
               "the same requests for both, holds 0; live: their 95 % intervals overlap): no difference is shown "
               "there. "
               "A live difference outside the intervals is no verdict either: they leave out how much a rerun "
               "moves. floor: the TTFT of an idle node with every reusable token cached.")


@dataclass(frozen=True, slots=True)
class VerdictView:
    """The demo's verdict as the report shows it (demo_verdict.verdict_table's rows).

    heading: which window, seeds and interval; legend: how it was made and
    reproduced; per_run: per policy, its burst p99 (ms) on each realization
    named in run_labels; timelines and arrivals: the first realization's
    window, per policy, as timeline_figure draws them (label names it)."""

    heading: str
    titles: list[str]
    rows: list[list[str]]
    legend: str
    timelines: Mapping[str, Mapping[str, object]]
    arrivals: Sequence[tuple[float, str]]
    label: str
    run_labels: Sequence[str] = ()
    per_run: Mapping[str, Sequence[float | None]] | None = None

    def markdown(self) -> str:
        return "\n".join(["| " + " | ".join(self.titles) + " |", "|---|" + "---:|" * (len(self.titles) - 1),
                          *("| " + " | ".join(r) + " |" for r in self.rows)])


def verdict_console_table(view: VerdictView) -> Table:
    table = Table(box=box.SIMPLE_HEAD)
    for i, name in enumerate(view.titles):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in view.rows:
        table.add_row(*row)
    return table


@dataclass(frozen=True, slots=True)
class Cell:
    """One figure as the demo shows it; tie: inside the baseline's interval."""

    text: str
    tie: bool = False

    def marked(self) -> str:
        return f"{TIE_MARK} {self.text}" if self.tie else self.text


def demo_cells(policies: Mapping[str, PolicySummary], with_intervals: bool,
               baseline: str = BASELINE) -> dict[str, list[Cell]]:
    """Per policy: its DEMO_COLUMNS figures, GiB replicated (a total of the
    run: no interval), and VERDICT_FIGURE against the baseline's. A figure
    is a tie when it is not the baseline's own and is_tie says so.
    with_intervals (a live run): each figure's interval beside
    it, and no "better" or "worse" (versus says why)."""
    base = policies.get(baseline)
    out: dict[str, list[Cell]] = {}
    for name, row in policies.items():
        cells = []
        for key, _ in DEMO_COLUMNS:
            tie = name != baseline and base is not None and bool(is_tie(row, base, key))
            cells.append(Cell(_figure_text(row, key, with_intervals), tie))
        cells.append(Cell(fmt("bytes_replicated", row.bytes_replicated)))
        if base is None:
            cells.append(Cell("-"))
        else:
            cells.append(Cell("baseline" if name == baseline else
                              versus(row, base, verdict=not with_intervals)))
        out[name] = cells
    return out


def _figure_text(row: PolicySummary | FloorSummary, key: str, with_interval: bool) -> str:
    value = figure_of(row, key)
    if not isinstance(value, (int, float)):
        return "-"
    digits = 2 if key == "slo_attainment" else 0
    text = f"{value:.{digits}f}"
    interval = (getattr(row, "ci95", None) or {}).get(key)
    if with_interval and interval is not None:
        text += f" [{interval[0]:.{digits}f}-{interval[1]:.{digits}f}]"
    return text


def _demo_rows(simulated: Mapping[str, PolicySummary], live: Mapping[str, PolicySummary],
               floor: FloorSummary | None) -> list[tuple[str, str, list[Cell], bool]]:
    """(policy, run, cells, dim) in the order every rendering shows them:
    the simulated policies, the floor, then the live ones."""
    rows = [(name, SIMULATED_RUN, cells, False) for name, cells in demo_cells(simulated, False).items()]
    if floor is not None:
        rows.append(("floor", "lower bound",
                     [Cell(_figure_text(floor, k, False)) for k, _ in DEMO_COLUMNS] + [Cell(""), Cell("")], True))
    rows += [(name, LIVE_RUN, cells, False) for name, cells in demo_cells(live, True).items()]
    return rows


def demo_titles() -> list[str]:
    return ["policy", "figures", *[t for _, t in DEMO_COLUMNS], "GiB replicated", f"burst p99 vs {BASELINE}"]


def demo_table(title: str, simulated: Mapping[str, PolicySummary], live: Mapping[str, PolicySummary],
               floor: FloorSummary | None) -> Table:
    """The demo's console table: simulated rows, the floor, then live rows
    (a section of their own); ties dimmed and marked. DEMO_LEGEND says how
    to read it: print it below."""
    # No column rules: the table must fit a terminal next to intervals' width.
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for i, name in enumerate(demo_titles()):
        table.add_column(name, justify="left" if i < 2 else "right")
    rows = _demo_rows(simulated, live, floor)
    for i, (name, run, cells, dim) in enumerate(rows):
        if i and run == LIVE_RUN and rows[i - 1][1] != LIVE_RUN:
            table.add_section()
        table.add_row(name, run, *(Text(c.marked(), style="dim" if c.tie else "") for c in cells),
                      style="dim" if dim else None)
    return table


def demo_markdown(simulated: Mapping[str, PolicySummary], live: Mapping[str, PolicySummary],
                  floor: FloorSummary | None) -> str:
    lines = ["| " + " | ".join(demo_titles()) + " |", "|---|---|" + "---:|" * (len(demo_titles()) - 2)]
    for name, run, cells, _ in _demo_rows(simulated, live, floor):
        lines.append(f"| {name} | {run} | " + " | ".join(c.marked() for c in cells) + " |")
    return "\n".join(lines)


def write_demo_report(out_dir: Path, heading: str, verdict: VerdictView, simulated: Comparison, live: Comparison,
                      ttfts: Mapping[str, Mapping[str, Sequence[float]]],
                      timelines: Mapping[str, Mapping[str, Mapping[str, object]]],
                      extra: Mapping[str, object]) -> Path:
    """Writes result.json, table.md, the PNGs and index.html of one demo;
    returns index.html's path. heading: what was run, in a sentence;
    verdict: the simulated window's verdict; simulated and live: the live
    check's slice. ttfts and timelines (the slice's: its bytes over time)
    are keyed by run (SIMULATED_RUN, LIVE_RUN), then by policy, as
    write_report's; extra: more top-level JSON (the workload, the verdict)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {**extra, "simulated": simulated.to_json(), "live": live.to_json()}
    (out_dir / "result.json").write_text(json.dumps(data, indent=2))
    (out_dir / "table.md").write_text(f"{verdict.heading}\n\n{verdict.markdown()}\n\n{LIVE_CHECK}: the slice, "
                                      "simulated and live\n\n"
                                      + demo_markdown(simulated.policies, live.policies, simulated.floor) + "\n")
    plots = {
        "verdict_window.png": (_verdict_figure(verdict),
                               f"{VERDICT_TITLE}: TTFT p99 in burst seconds over the window, per policy; one "
                               f"bar per realization ({', '.join(verdict.run_labels)}). Lower is better."),
        "timeline.png": (timeline_figure(verdict.timelines, verdict.arrivals),
                         f"Verdict window (simulated, {verdict.label}): arrivals per second of up to three of its "
                         "busiest families (grey), the predictor's forecast of each in the same unit (lines: the "
                         "requests it expects within its horizon, named in the legend, divided by that horizon; "
                         "only the policies that read forecasts run the predictor in the simulator) and the "
                         "replicas committed for it (ticks), per policy."),
        "slice.png": (_demo_figures(simulated.policies, live.policies, simulated.floor),
                      f"{LIVE_CHECK}: TTFT per policy on the slice. Bars: simulated, with the 95 % bootstrap "
                      "interval over requests as a whisker; diamonds: live, with theirs. Hatched bars and hollow "
                      f"diamonds tie with {BASELINE} of the same kind of run (is_tie); the dashed line is the floor "
                      "(an idle node with every reusable token cached)."),
        "ttft_cdf.png": (_demo_cdf(ttfts, simulated.ttft_target_ms),
                         f"{LIVE_CHECK}: share of the slice's requests with at most a given TTFT: simulated (solid) "
                         "and live (dashed), one colour per policy. Further left is faster."),
        "bytes_over_time.png": (_demo_bytes(timelines, simulated.slice.start_s,
                                            simulated.slice.start_s + simulated.slice.duration_s),
                                f"{LIVE_CHECK}: bytes copied by replication so far over the slice, in bytes of the "
                                "real model: simulated (solid) and live (dashed)."),
    }
    for name, (figure, _) in plots.items():
        figure.savefig(out_dir / name, dpi=110, bbox_inches="tight")
        plt.close(figure)
    index = out_dir / "index.html"
    index.write_text(_demo_html(heading, verdict, simulated, live, out_dir, {n: c for n, (_, c) in plots.items()},
                                data))
    return index


def _verdict_figure(verdict: VerdictView):
    """Grouped bars: per policy, its burst p99 on each realization."""
    per_run = verdict.per_run or {}
    names = list(per_run)
    runs = len(verdict.run_labels) or 1
    figure, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / runs
    x = np.arange(len(names))
    for k, label in enumerate(verdict.run_labels or [""]):
        values = [per_run[n][k] if k < len(per_run[n]) and per_run[n][k] is not None else np.nan for n in names]
        ax.bar(x - 0.4 + width * (k + 0.5), values, width, color=f"C{k}", label=label or None)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("burst TTFT p99 (ms)")
    ax.set_ylim(bottom=0)
    if verdict.run_labels:
        ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def _policy_colors(names: Sequence[str]) -> dict[str, str]:
    return {name: f"C{i % 10}" for i, name in enumerate(names)}


def _demo_figures(simulated: Mapping[str, PolicySummary], live: Mapping[str, PolicySummary],
                  floor: FloorSummary | None):
    keys = list(DEMO_PANELS.items())
    names = list(dict.fromkeys([*simulated, *live]))
    figure, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 4.2), squeeze=False)
    x = np.arange(len(names))
    for ax, (key, title) in zip(axes[0], keys):
        for runs, offset, live_run in ((simulated, -0.15, False), (live, 0.2, True)):
            base = runs.get(BASELINE)
            for i, name in enumerate(names):
                row = runs.get(name)
                value = figure_of(row, key)
                if row is None or not isinstance(value, (int, float)):
                    continue
                tie = name != BASELINE and base is not None and bool(is_tie(row, base, key))
                interval = (row.ci95 or {}).get(key)
                yerr = None if interval is None else [[max(0.0, value - interval[0])], [max(0.0, interval[1] - value)]]
                if live_run:
                    ax.errorbar([x[i] + offset], [value], yerr=yerr, fmt="D", color="C1", markersize=7,
                                markerfacecolor="white" if tie else "C1", capsize=3, elinewidth=1)
                else:
                    ax.bar(x[i] + offset, value, 0.5, color="C0", alpha=0.45 if tie else 0.9,
                           hatch="//" if tie else None, edgecolor="C0", yerr=yerr,
                           error_kw={"elinewidth": 1, "capsize": 3, "ecolor": "black"})
        floor_value = figure_of(floor, key)
        if isinstance(floor_value, (int, float)):
            ax.axhline(floor_value, color="black", linestyle="--", linewidth=1)
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
    handles = [Patch(color="C0", alpha=0.9, label="simulated"),
               Patch(facecolor="C0", alpha=0.45, hatch="//", edgecolor="C0", label=f"simulated, tie with {BASELINE}"),
               Line2D([], [], marker="D", color="C1", linestyle="", label="live (95 % CI)"),
               Line2D([], [], marker="D", color="C1", markerfacecolor="white", linestyle="",
                      label=f"live, tie with {BASELINE}"),
               Line2D([], [], color="black", linestyle="--", linewidth=1, label="floor")]
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    figure.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False,
                  bbox_to_anchor=(0.5, 0.0))
    return figure


def _demo_cdf(ttfts: Mapping[str, Mapping[str, Sequence[float]]], target: object):
    figure, ax = plt.subplots(figsize=(8, 4.2))
    names = list(dict.fromkeys([n for runs in ttfts.values() for n in runs]))
    colors = _policy_colors(names)
    for run, style in ((SIMULATED_RUN, "-"), (LIVE_RUN, "--")):
        for name, values in ttfts.get(run, {}).items():
            if values:
                v = np.sort(np.asarray(values))
                ax.plot(v, np.arange(1, v.size + 1) / v.size, style, color=colors[name],
                        label=f"{name}, {run.split(',')[0]}")
    if isinstance(target, (int, float)):
        ax.axvline(target, color="grey", linestyle=":", label="SLO target")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms of the real model)")
    ax.set_ylabel("share of requests")
    ax.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    return figure


def _demo_bytes(timelines: Mapping[str, Mapping[str, Mapping[str, object]]], start_s: float, end_s: float):
    """Cumulative replicated GiB per run and policy over the slice [start_s, end_s)."""
    figure, ax = plt.subplots(figsize=(8, 3.6))
    names = list(dict.fromkeys([n for runs in timelines.values() for n in runs]))
    colors = _policy_colors(names)
    for run, style in ((SIMULATED_RUN, "-"), (LIVE_RUN, "--")):
        for name, line in timelines.get(run, {}).items():
            commits = sorted(line.get("commits", []))
            label = f"{name}, {run.split(',')[0]}"
            if commits:
                # From 0 at the slice's start to the total at its end, so every line spans the slice.
                total = np.cumsum([c[1] for c in commits]) / 2**30
                ax.step([start_s, *[c[0] for c in commits], end_s], [0.0, *total, total[-1]], style, where="post",
                        color=colors[name], label=label)
            else:
                ax.plot([start_s, end_s], [0.0, 0.0], style, color=colors[name], label=f"{label}: nothing")
    ax.set_xlim(start_s, end_s)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("trace time (s)")
    ax.set_ylabel("GiB replicated, cumulative")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    return figure


def _demo_html(heading: str, verdict: VerdictView, simulated: Comparison, live: Comparison, out_dir: Path,
               captions: Mapping[str, str], data: Mapping[str, object]) -> str:
    rows = _demo_rows(simulated.policies, live.policies, simulated.floor)
    head = "".join(f"<th{' class=l' if i < 2 else ''}>{html.escape(t)}</th>" for i, t in enumerate(demo_titles()))
    body = []
    for i, (name, run, cells, dim) in enumerate(rows):
        group = " class='group'" if i and run != rows[i - 1][1] else ""
        tds = "".join(f"<td{' class=tie' if c.tie else ''}>{html.escape(c.marked())}</td>" for c in cells)
        body.append(f"<tr{group}{' style=color:#777' if dim else ''}><td class=l>{html.escape(name)}</td>"
                    f"<td class=l>{html.escape(run)}</td>{tds}</tr>")
    verdict_head = "".join(f"<th{' class=l' if i == 0 else ''}>{html.escape(t)}</th>"
                           for i, t in enumerate(verdict.titles))
    verdict_body = "".join("<tr>" + "".join(f"<td{' class=l' if i == 0 else ''}>{html.escape(c)}</td>"
                                            for i, c in enumerate(r)) + "</tr>" for r in verdict.rows)

    def figures(names: Sequence[str]) -> str:
        return "".join(
            f"<figure><img alt='{html.escape(n)}' src='data:image/png;base64,"
            f"{base64.b64encode((out_dir / n).read_bytes()).decode()}'/><figcaption>{html.escape(captions[n])}"
            "</figcaption></figure>" for n in names if n in captions)
    details = "".join(
        f"<h3>{html.escape(label)}</h3>"
        + "".join(f"<div class=wide>{_columns_html(c.policies, c.floor, columns)}</div>"
                  for columns in (LEAD_COLUMNS, HEADLINE_COLUMNS))
        + f"<ul>{''.join(f'<li>{html.escape(str(n))}</li>' for n in c.notes)}</ul>"
        for label, c in ((f"{LIVE_CHECK}, simulated", simulated), (f"{LIVE_CHECK}, live", live)))
    style = "".join([
        "body{font-family:system-ui,sans-serif;max-width:1180px;margin:24px auto;padding:0 16px;color:#222}",
        "table{border-collapse:collapse;font-size:14px;margin:8px 0}",
        "td,th{padding:4px 10px;border-bottom:1px solid #e3e3e3;text-align:right;white-space:nowrap}",
        "th{border-bottom:2px solid #999}.l{text-align:left}tr.group td{border-top:2px solid #999}",
        "td.tie{color:#888}figure{margin:24px 0}img{max-width:100%}figcaption{color:#555;font-size:14px}",
        ".heading{font-size:16px;max-width:900px}.legend{color:#555;font-size:14px;max-width:900px}",
        ".wide{overflow-x:auto}.wide table{font-size:13px}.wide td,.wide th{padding:3px 6px}",
        ".wide td:first-child,.wide th:first-child{text-align:left}",
        "pre{font-size:12px;background:#f6f6f6;padding:8px;overflow-x:auto}",
        # The verdict's per-seed titles wrap, so its table fits the page beside every seed's column.
        "table.verdict th{white-space:normal;max-width:110px;vertical-align:bottom}"])
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>speckv demo</title><style>{style}</style>"
            f"</head><body><h1>speckv demo</h1><p class=heading>{html.escape(heading)}</p>"
            f"<h2>{VERDICT_TITLE}: burst p99 against {BASELINE} over a window of several bursts</h2>"
            f"<p class=heading>{html.escape(verdict.heading.removeprefix(VERDICT_TITLE + ': '))}</p>"
            f"<div class=wide><table class=verdict><tr>{verdict_head}</tr>{verdict_body}</table></div>"
            f"<p class=legend>{html.escape(verdict.legend)}</p>"
            f"{figures(['verdict_window.png', 'timeline.png'])}"
            f"<h2>{LIVE_CHECK}: the first slice of the window, simulated and live</h2>"
            f"<table><tr>{head}</tr>"
            f"{''.join(body)}</table><p class=legend>{html.escape(DEMO_LEGEND)}</p>"
            f"{figures(['slice.png', 'ttft_cdf.png', 'bytes_over_time.png'])}"
            f"<h2>Every figure of the live check</h2><p class=legend>README.md, \"Reading the comparison\", says "
            "what each "
            f"column means.</p>{details}"
            f"<details><summary>JSON</summary><pre>{html.escape(json.dumps(data, indent=2))}</pre></details>"
            "</body></html>")


def _columns_html(policies: Mapping[str, PolicySummary], floor: FloorSummary | None,
                  columns: Sequence[tuple[str, str]]) -> str:
    rows: list[tuple[str, PolicySummary | FloorSummary]] = [*policies.items(), *([(FLOOR_ROW, floor)] if floor else [])]
    head = "".join(f"<th>{html.escape(t)}</th>" for t in ["policy", *[t for _, t in columns]])
    body = "".join("<tr>" + f"<td>{html.escape(name)}</td>"
                   + "".join(f"<td>{html.escape(fmt(k, figure_of(m, k)))}</td>" for k, _ in columns) + "</tr>"
                   for name, m in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
