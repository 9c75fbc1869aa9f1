"""The comparison report: a Markdown table, PNG plots (matplotlib, Agg) and
one self-contained HTML page embedding them (base64), plus the JSON.

Plots: TTFT CDF per policy; burst-window p99 per policy (with overall p99
beside it, and the TTFT floor of loadgen/experiments/ttft_floor.py as a dashed line when
the result has one); a time line of arrivals, forecasts and committed replicas for the
hottest families (per policy); replicated bytes over time per policy.
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

from speckv.loadgen.experiments.results import Comparison, FloorSummary, PolicySummary, figure_of  # noqa: E402

# What placement can change (returning requests, where their reused tokens
# came from, the avoidable latency closed), then the headline figures and
# replication. The Markdown table has both; the console prints one table each.
LEAD_COLUMNS = [("returning_ttft_p99_ms", "returning p99"), ("first_seen_ttft_p99_ms", "first-seen p99"),
                ("reuse_recovered_ratio", "reuse recovered"), ("device_hit_ratio", "device"),
                ("host_hit_ratio", "host"), ("peer_pull_ratio", "peer"), ("recompute_ratio", "recompute"),
                ("promotion_ms_mean", "promote ms"), ("pull_ms_mean", "pull ms"),
                ("avoidable_closed", "avoidable closed")]
HEADLINE_COLUMNS = [("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "p99"), ("burst_ttft_p99_ms", "burst p99"),
                    ("slo_attainment", "SLO"), ("bytes_replicated", "GiB replicated"),
                    ("replica_landings_read_ratio", "replicas read"), ("wasted_bytes_ratio", "wasted"),
                    ("burst_cache_lost_ratio", "burst cache lost"), ("errors", "errors")]
TABLE_COLUMNS = LEAD_COLUMNS + HEADLINE_COLUMNS
FLOOR_ROW = "floor (idle node, unbounded cache)"


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
    table.add_column("policy")
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
                 timelines: Mapping[str, Mapping[str, object]], arrivals: Sequence[tuple[float, str]]) -> Path:
    """Writes result.json, table.md, the PNGs and index.html; returns index.html's path.

    timelines[policy] = {"commits": [(trace s, real bytes, family)], "forecasts": [(trace s, family, count)]};
    arrivals = (trace s, family) of the replayed slice."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(json.dumps(result.to_json(), indent=2))
    table = markdown_table(result.policies, result.floor)
    (out_dir / "table.md").write_text(table + "\n")
    plots = {
        "ttft_cdf.png": _ttft_cdf(ttfts, result.ttft_target_ms),
        "burst_p99.png": _burst_p99(result.policies, result.floor),
        "timeline.png": _timeline(timelines, arrivals),
        "bytes_over_time.png": _bytes_over_time(timelines),
    }
    for name, figure in plots.items():
        figure.savefig(out_dir / name, dpi=110, bbox_inches="tight")
        plt.close(figure)
    index = out_dir / "index.html"
    index.write_text(_html(result, table, out_dir, list(plots)))
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
    ax.bar(x - 0.2, overall, 0.4, label="all requests")
    ax.bar(x + 0.2, burst, 0.4, label="burst windows")
    if floor and floor.burst_ttft_p99_ms:
        ax.axhline(floor.burst_ttft_p99_ms, color="black", linestyle="--", linewidth=1,
                   label="floor, burst windows (idle node, unbounded cache)")
    ax.set_xticks(x, names)
    ax.set_ylabel("TTFT p99 (ms)")
    ax.set_title("p99 TTFT, overall and in burst windows")
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9)
    return figure


def _timeline(timelines: Mapping[str, Mapping[str, object]], arrivals: Sequence[tuple[float, str]]):
    hottest = [f for f, _ in Counter(f for _, f in arrivals).most_common(3)]
    figure, axes = plt.subplots(len(hottest) or 1, 1, figsize=(8, 2.6 * max(1, len(hottest))), squeeze=False)
    for ax, family in zip(axes[:, 0], hottest or [""]):
        times = [t for t, f in arrivals if f == family]
        if times:
            edges = np.arange(np.floor(min(times)), np.ceil(max(times)) + 2)
            ax.hist(times, bins=edges, color="lightgrey", label="arrivals / s")
        for name, line in timelines.items():
            points = [(t, c) for t, f, c in line.get("forecasts", []) if f == family]
            if points:
                ax.plot(*zip(*points), label=f"{name}: forecast")
            commits = [t for t, _, f in line.get("commits", []) if f == family]
            if commits:
                ax.plot(commits, np.zeros(len(commits)), "|", markersize=14, label=f"{name}: replica committed")
        ax.set_title(f"family {family}")
        ax.set_xlabel("trace time (s)")
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


def _html(result: Comparison, table: str, out_dir: Path, images: list[str]) -> str:
    rows = table.splitlines()
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    body = [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]
    table_html = ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
                  + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
                  + "</table>")
    figures = "".join(
        f'<figure><img alt="{n}" src="data:image/png;base64,'
        f'{base64.b64encode((out_dir / n).read_bytes()).decode()}"/><figcaption>{n}</figcaption></figure>'
        for n in images)
    notes = "".join(f"<li>{html.escape(str(n))}</li>" for n in result.notes)
    data = result.to_json()
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>speckv end-to-end</title>"
            f"<style>body{{font-family:sans-serif;max-width:1000px;margin:auto}}td,th{{padding:4px 8px;"
            f"border-bottom:1px solid #ddd;text-align:right}}img{{max-width:100%}}</style></head><body>"
            f"<h1>speckv end-to-end comparison</h1><p>trace {html.escape(result.trace)}, slice "
            f"{html.escape(json.dumps(data['slice']))}</p>{table_html}<ul>{notes}</ul>{figures}"
            f"<h2>JSON</h2><pre>{html.escape(json.dumps(data, indent=2))}</pre></body></html>")
