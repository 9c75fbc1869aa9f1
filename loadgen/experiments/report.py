"""The comparison report: a Markdown table, PNG plots (matplotlib, Agg) and
one self-contained HTML page embedding them (base64), plus the JSON.

Plots: TTFT CDF per policy; burst-window p99 per policy (with overall p99
beside it, its 95 % interval as a whisker when the summary has one, and the
TTFT floor of loadgen/experiments/ttft_floor.py as a dashed line when the
result has one); a time line of arrivals, forecasts and committed replicas
for the hottest families (per policy); replicated bytes over time per policy.

The verdict of a policy against the baseline (versus) says "tie" where
is_tie finds its figure tied with the baseline's (a simulated figure: the
paired interval of their difference holds 0; a live one: their intervals
overlap). The demo's report, one slice simulated and live side by side, is
demo_report.py.
"""
from __future__ import annotations

import base64
import html
import json
from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from rich.table import Table  # noqa: E402

from speckv.loadgen.experiments.action_table import action_table  # noqa: E402
from speckv.loadgen.experiments.event_table import event_table, load_around_events, utilisation_table  # noqa: E402
from speckv.loadgen.experiments.repeats import repeats_table  # noqa: E402
from speckv.loadgen.experiments.results import Comparison, FloorSummary, PolicySummary, figure_of  # noqa: E402

# What placement can change (returning requests, where their reused tokens
# came from, the avoidable latency closed), then the headline figures and
# replication. The Markdown table has both; the console prints one table each.
LEAD_COLUMNS = [("returning_ttft_p99_ms", "returning p99"), ("first_seen_ttft_p99_ms", "first-seen p99"),
                ("reuse_recovered_ratio", "reuse recovered"), ("device_hit_ratio", "device"),
                ("host_hit_ratio", "host"), ("disk_load_ratio", "disk"), ("peer_pull_ratio", "peer"),
                ("recompute_ratio", "recompute"), ("promotion_ms_mean", "promote ms"),
                ("disk_load_ms_mean", "disk load ms"), ("pull_ms_mean", "pull ms"),
                ("avoidable_closed", "avoidable closed")]
HEADLINE_COLUMNS = [("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "p99"), ("burst_ttft_p99_ms", "burst p99"),
                    ("slo_attainment", "SLO"), ("bytes_replicated", "GiB replicated"),
                    ("replica_landings_read_ratio", "replicas read"), ("wasted_bytes_ratio", "wasted"),
                    ("burst_cache_lost_ratio", "burst cache lost"), ("errors", "errors")]
TABLE_COLUMNS = LEAD_COLUMNS + HEADLINE_COLUMNS
FLOOR_ROW = "floor (idle node, unbounded cache)"

# The verdict is on the burst-window p99, the figure bursts make explode (DESIGN.md),
# against the baseline policy.
VERDICT_FIGURE = "burst_ttft_p99_ms"
ACTIONS_TITLE = "Speculative actions: what each order came to (expected at planning time, not measured)"
ABLATION_TITLE = "What each action measurably saved: the same run without it"
BASELINE = "none"


def fmt(key: str, value: object) -> str:
    if value is None:
        return "-"
    if key == "bytes_replicated":
        return f"{value / 2**30:.2f}"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.0f}"
    return str(value)


def console_tables(title: str, policies: Mapping[str, PolicySummary], floor: FloorSummary | None = None,
                   extra: Mapping[str, Sequence[str]] | None = None, extra_titles: Sequence[str] = ()) -> list[Table]:
    """The comparison for a terminal: where latency comes from, then the
    headline figures (with extra[policy] cells under extra_titles appended)."""
    return [_policy_table(f"{title}: where latency comes from", LEAD_COLUMNS, policies, floor, {}, ()),
            _policy_table(f"{title}: headline and replication", HEADLINE_COLUMNS, policies, floor, extra or {},
                          extra_titles)]


def _policy_table(title: str, columns: list[tuple[str, str]], policies: Mapping[str, PolicySummary],
                  floor: FloorSummary | None, extra: Mapping[str, Sequence[str]],
                  extra_titles: Sequence[str]) -> Table:
    table = Table(title=title)
    # A policy's name is what the row is about: the figures' headers wrap first.
    table.add_column("policy", min_width=max((len(n) for n in policies), default=6))
    for name in [t for _, t in columns] + list(extra_titles):
        table.add_column(name, justify="right")
    for name, m in policies.items():
        table.add_row(name, *(fmt(k, figure_of(m, k)) for k, _ in columns), *extra.get(name, ()))
    if floor:
        table.add_row(FLOOR_ROW, *(fmt(k, figure_of(floor, k)) for k, _ in columns), *[""] * len(extra_titles),
                      style="dim")
    return table


def markdown_table(policies: Mapping[str, PolicySummary], floor: FloorSummary | None = None) -> str:
    """One row per policy; with floor (loadgen/experiments/ttft_floor.py), a last row
    holding the TTFT no policy can beat, its other cells blank."""
    lines = ["| policy | " + " | ".join(title for _, title in TABLE_COLUMNS) + " |",
             "|---|" + "---:|" * len(TABLE_COLUMNS)]
    rows: list[tuple[str, PolicySummary | FloorSummary]] = [*policies.items(), *([(FLOOR_ROW, floor)] if floor else [])]
    for name, m in rows:
        lines.append(f"| {name} | " + " | ".join(fmt(k, figure_of(m, k)) for k, _ in TABLE_COLUMNS) + " |")
    return "\n".join(lines)


def write_report(out_dir: Path, result: Comparison, ttfts: Mapping[str, Sequence[float]],
                 timelines: Mapping[str, Mapping[str, object]], arrivals: Sequence[tuple[float, str]],
                 ablation: str = "") -> Path:
    """Writes result.json, table.md, the PNGs and index.html; returns index.html's path.

    timelines[policy] = {"commits": [(trace s, real bytes, family)], "forecasts": [(trace s, family, count)],
    "forecast_horizon_s": the forecasts' horizon, trace s (forecast_rates)};
    arrivals = (trace s, family) of the replayed slice; ablation: the Markdown
    table of what each action measurably saved (loadgen/sim/ablation.py), if run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(json.dumps(result.to_json(), indent=2))
    table = markdown_table(result.policies, result.floor)
    (out_dir / "table.md").write_text(table + "\n")
    plots = {
        "ttft_cdf.png": _ttft_cdf(ttfts, result.ttft_target_ms),
        "burst_p99.png": _burst_p99(result.policies, result.floor),
        "timeline.png": timeline_figure(timelines, arrivals),
        "bytes_over_time.png": _bytes_over_time(timelines),
    }
    loads = {p: t["node_load"] for p, t in timelines.items() if t.get("node_load")}
    if loads:
        plots["load_around_events.png"] = load_around_events(loads)  # type: ignore[arg-type]
    for name, figure in plots.items():
        figure.savefig(out_dir / name, dpi=110, bbox_inches="tight")
        plt.close(figure)
    extra = "\n\n".join(t for t in (utilisation_table(result.policies), event_table(result.policies),
                                     repeats_table(result.policies)) if t)
    sections = [(title, t) for title, t in ((ACTIONS_TITLE, action_table(result.policies)),
                                             (ABLATION_TITLE, ablation)) if t]
    index = out_dir / "index.html"
    index.write_text(_html(result, table + ("\n\n" + extra if extra else ""), out_dir, list(plots), sections))
    return index


def _ttft_cdf(ttfts: Mapping[str, Sequence[float]], target: object):
    figure, ax = plt.subplots(figsize=(7, 4))
    for name, values in ttfts.items():
        if values:
            v = np.sort(np.asarray(values))
            ax.plot(v, np.arange(1, v.size + 1) / v.size, label=name)
    if isinstance(target, (int, float)):
        ax.axvline(target, color="grey", linestyle="--", label="SLO target")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, real model time)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF per policy")
    ax.legend()
    return figure


def _burst_p99(policies: Mapping[str, PolicySummary], floor: FloorSummary | None):
    figure, ax = plt.subplots(figsize=(7, 4))
    names = list(policies)
    x = np.arange(len(names))
    overall = [policies[n].ttft_p99_ms or 0.0 for n in names]
    burst = [policies[n].burst_ttft_p99_ms or 0.0 for n in names]
    ax.bar(x - 0.2, overall, 0.4, label="all requests", yerr=_whiskers(policies, names, "ttft_p99_ms"),
           error_kw={"elinewidth": 1, "capsize": 3})
    ax.bar(x + 0.2, burst, 0.4, label="burst windows", yerr=_whiskers(policies, names, "burst_ttft_p99_ms"),
           error_kw={"elinewidth": 1, "capsize": 3})
    if floor and floor.burst_ttft_p99_ms:
        ax.axhline(floor.burst_ttft_p99_ms, color="black", linestyle="--", linewidth=1,
                   label="floor, burst windows (idle node, unbounded cache)")
    ax.set_xticks(x, names)
    ax.set_ylabel("TTFT p99 (ms)")
    ax.set_title("p99 TTFT, overall and in burst windows")
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9)
    return figure


def _whiskers(policies: Mapping[str, PolicySummary], names: Sequence[str], key: str) -> np.ndarray | None:
    """matplotlib's yerr (2 x n: below, above) of each policy's 95 % interval
    of `key`; None when no policy has one (0 where one policy lacks it)."""
    if not any((policies[n].ci95 or {}).get(key) for n in names):
        return None
    out = np.zeros((2, len(names)))
    for i, n in enumerate(names):
        value, interval = figure_of(policies[n], key), (policies[n].ci95 or {}).get(key)
        if isinstance(value, (int, float)) and interval is not None:
            out[:, i] = (max(0.0, value - interval[0]), max(0.0, interval[1] - value))
    return out


def timeline_families(timelines: Mapping[str, Mapping[str, object]], arrivals: Sequence[tuple[float, str]],
                      count: int = 3) -> list[str]:
    """The families worth a time line: those with a replica committed, a
    forecast of at least one request or at least two arrivals (a lone
    request, forecast near zero, shows nothing over time); the most
    arrivals first, then the most commits, then the highest forecast; at
    most count."""
    arrived = Counter(f for _, f in arrivals)
    commits = Counter(f for line in timelines.values() for _, _, f in line.get("commits", []))
    forecast: dict[str, float] = {}
    for line in timelines.values():
        for _, f, expected in line.get("forecasts", []):
            forecast[f] = max(forecast.get(f, 0.0), expected)
    candidates = [f for f in {*arrived, *commits, *forecast}
                  if arrived[f] >= 2 or commits[f] or forecast.get(f, 0.0) >= 1.0]
    return sorted(candidates, key=lambda f: (-arrived[f], -commits[f], -forecast.get(f, 0.0), f))[:count]


def forecast_rates(line: Mapping[str, object], family: str) -> list[tuple[float, float]]:
    """(trace s, requests / s) of line's forecasts of family: each count of
    requests expected within the forecast's horizon (line["forecast_horizon_s"],
    trace s) over that horizon, so it reads in the unit of arrivals per second."""
    points = [(t, c) for t, f, c in line.get("forecasts", []) if f == family]  # type: ignore[attr-defined]
    if not points:
        return []
    horizon_s = line.get("forecast_horizon_s")
    if not isinstance(horizon_s, (int, float)) or horizon_s <= 0:
        raise ValueError("a time line with forecasts needs its forecast_horizon_s (trace s, > 0)")
    return [(t, c / horizon_s) for t, c in points]


def timeline_figure(timelines: Mapping[str, Mapping[str, object]], arrivals: Sequence[tuple[float, str]]):
    hottest = timeline_families(timelines, arrivals)
    figure, axes = plt.subplots(len(hottest) or 1, 1, figsize=(8, 2.6 * len(hottest) if hottest else 0.8),
                                squeeze=False)
    span = (np.floor(min(t for t, _ in arrivals)), np.ceil(max(t for t, _ in arrivals)) + 1) if arrivals else None
    if not hottest:
        axes[0, 0].text(0.5, 0.5, "No family had two requests, a forecast or a replica in this slice.",
                        ha="center", va="center", transform=axes[0, 0].transAxes)
        axes[0, 0].set_axis_off()
    for ax, family in zip(axes[:, 0], hottest):
        times = [t for t, f in arrivals if f == family]
        if times and span is not None:
            ax.hist(times, bins=np.arange(span[0], span[1] + 1), color="lightgrey", label="arrivals / s")
        for i, (name, line) in enumerate(timelines.items()):
            color = f"C{i % 10}"
            points = forecast_rates(line, family)
            if points:
                ax.plot(*zip(*points), color=color,
                        label=f"{name}: forecast / s over the next {line['forecast_horizon_s']:g} s")
            commits = [t for t, _, f in line.get("commits", []) if f == family]
            if commits:
                # On the axis, drawn over it (clip_on=False), thick enough to see among the bars.
                ax.plot(commits, np.zeros(len(commits)), "|", color=color, markersize=16, markeredgewidth=2.5,
                        clip_on=False, label=f"{name}: replica committed")
        ax.set_title(f"family {family}")
        ax.set_xlabel("trace time (s)")
        ax.set_ylabel("requests / s")
        if span is not None:
            ax.set_xlim(*span)
        ax.set_ylim(0, max(1.0, ax.get_ylim()[1]))  # counts: never below 0, and a lone tick still gets a scale
        ax.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    return figure


def _bytes_over_time(timelines: Mapping[str, Mapping[str, object]]):
    figure, ax = plt.subplots(figsize=(7, 4))
    for name, line in timelines.items():
        commits = sorted(line.get("commits", []))
        if commits:
            t = [c[0] for c in commits]
            ax.step(t, np.cumsum([c[1] for c in commits]) / 2**30, where="post", label=name)
        else:
            ax.plot([], [], label=f"{name} (none)")
    ax.set_xlabel("trace time (s)")
    ax.set_ylabel("replicated GiB (real model bytes), cumulative")
    ax.set_title("Bytes moved by replication over time")
    ax.legend()
    return figure


def _html(result: Comparison, table: str, out_dir: Path, images: list[str],
          sections: Sequence[tuple[str, str]] = ()) -> str:
    table_html = _markdown_html(table)
    titled = "".join(f"<h2>{html.escape(title)}</h2><div style='overflow-x:auto'>{_markdown_html(t)}</div>"
                     for title, t in sections)
    figures = "".join(
        f'<figure><img alt="{n}" src="data:image/png;base64,'
        f'{base64.b64encode((out_dir / n).read_bytes()).decode()}"/><figcaption>{n}</figcaption></figure>'
        for n in images)
    notes = "".join(f"<li>{html.escape(str(n))}</li>" for n in result.notes)
    data = result.to_json()
    base = result.policies.get(BASELINE)
    # A live run's intervals leave out the run-to-run spread: its change is shown, never a verdict (versus).
    verdicts = "".join(f"<li><b>{html.escape(name)}</b>: {html.escape(verdict_line(row, base, result.live is None))}"
                       "</li>" for name, row in result.policies.items() if name != BASELINE and base is not None)
    verdicts = f"<h2>Burst p99 against {BASELINE}</h2><ul>{verdicts}</ul>" if verdicts else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>speckv end-to-end</title>"
            f"<style>body{{font-family:sans-serif;max-width:1000px;margin:auto}}td,th{{padding:4px 8px;"
            f"border-bottom:1px solid #ddd;text-align:right}}img{{max-width:100%}}</style></head><body>"
            f"<h1>speckv end-to-end comparison</h1><p>trace {html.escape(result.trace)}, slice "
            f"{html.escape(json.dumps(data['slice']))}</p>{verdicts}<div style='overflow-x:auto'>{table_html}</div>"
            f"<ul>{notes}</ul>{titled}{figures}"
            f"<h2>JSON</h2><pre>{html.escape(json.dumps(data, indent=2))}</pre></body></html>")


def is_tie(row: PolicySummary, baseline: PolicySummary, key: str) -> bool | None:
    """Whether row's figure `key` ties the baseline's: the 95 % interval of
    their difference on the same requests (ci95_vs_none, a paired bootstrap)
    holds 0 when row has one, else their own 95 % intervals (ci95) overlap,
    which is wider: it counts twice which requests the slice holds. None
    when there is neither: no tie can be judged."""
    paired = (row.ci95_vs_none or {}).get(key)
    if paired is not None:
        return paired[0] <= 0.0 <= paired[1]
    mine, base = (row.ci95 or {}).get(key), (baseline.ci95 or {}).get(key)
    if mine is None or base is None:
        return None
    return mine[0] <= base[1] and base[0] <= mine[1]


def versus(row: PolicySummary, baseline: PolicySummary, key: str = VERDICT_FIGURE, verdict: bool = True) -> str:
    """row's figure against the baseline's: its relative change, then "tie"
    when is_tie says so, else (verdict) "better" or "worse" (lower
    TTFT, higher SLO attainment is better); the bare change when there are no
    intervals. verdict=False for a live run: its intervals leave the
    run-to-run spread out, so a difference outside them is not yet a verdict."""
    mine, base = figure_of(row, key), figure_of(baseline, key)
    if not isinstance(mine, (int, float)) or not isinstance(base, (int, float)) or base == 0:
        return "-"
    change = f"{(mine - base) / base:+.0%}"
    tie = is_tie(row, baseline, key)
    if tie:
        return f"{change}, tie"
    if tie is None or not verdict:
        return change
    better = mine > base if key == "slo_attainment" else mine < base
    return f"{change}, {'better' if better else 'worse'}"


def verdict_line(row: PolicySummary, baseline: PolicySummary, verdict: bool = True) -> str:
    mine, base = figure_of(row, VERDICT_FIGURE), figure_of(baseline, VERDICT_FIGURE)
    if not isinstance(mine, (int, float)) or not isinstance(base, (int, float)):
        return "no burst request served"
    paired = (row.ci95_vs_none or {}).get(VERDICT_FIGURE)
    difference = "" if paired is None else f"; {mine - base:+.0f} ms, 95 % [{paired[0]:+.0f}, {paired[1]:+.0f}]"
    return f"{base:.0f} -> {mine:.0f} ms ({versus(row, baseline, verdict=verdict)}{difference})"


def _markdown_html(table: str) -> str:
    """One HTML table per Markdown table (tables are separated by a blank line)."""
    return "".join(_one_table_html(t) for t in table.split("\n\n") if t.strip())


def _one_table_html(table: str) -> str:
    rows = table.strip().splitlines()
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    body = [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
            + "</table>")
