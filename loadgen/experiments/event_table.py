"""What the console and the report show of utilisation, node events and
nodes needed: Markdown tables, and a plot of per-node load around each event
(per policy, per-node busy fraction per second, the event marked)."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from speckv.loadgen.experiments.results import PolicySummary  # noqa: E402

LOAD_WINDOW_S = 120  # seconds of per-node load drawn on each side of an event


def _cell(value: object, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def utilisation_table(policies: Mapping[str, PolicySummary]) -> str:
    rows = [(name, s.utilisation) for name, s in policies.items() if s.utilisation]
    if not rows:
        return ""
    lines = ["| policy | overload idle share | busy CV | node-seconds |", "|---|---:|---:|---:|"]
    for name, u in rows:
        lines.append(f"| {name} | {_cell(u.get('overload_idle_share'), 3)} | {_cell(u.get('busy_cv'), 3)} | "
                     f"{_cell(u.get('node_seconds'))} |")
    return "\n".join(lines)


EVENT_COLUMNS = [("kind", "event", 0), ("at_s", "at s", 0), ("node", "node", 0),
                 ("affected_ttft_p99_before_ms", "affected p99 before ms", 0),
                 ("affected_ttft_p99_after_ms", "after ms", 0), ("recovery_s", "recovery s", 0),
                 ("recompute_tokens", "recompute tokens", 0), ("requests_resent", "re-sent", 0),
                 ("requests_lost", "lost", 0)]
SCALE_OUT_COLUMNS = [("new_node_fair_share", "new node / fair share", 2),
                     ("new_node_prefix_hit_ratio", "new node hit", 2), ("cluster_prefix_hit_ratio", "cluster hit", 2),
                     ("new_node_returning_share", "new node returning", 2),
                     ("new_node_reuse_recovered", "new node reuse recovered", 2),
                     ("cluster_reuse_recovered", "cluster reuse recovered", 2),
                     ("prewarm_orders", "orders to new node", 0),
                     ("new_node_replica_hits", "new node replica hits", 0)]


def event_table(policies: Mapping[str, PolicySummary]) -> str:
    rows = [(name, e) for name, s in policies.items() for e in (s.events or [])]
    if not rows:
        return ""
    head = [title for _, title, _ in EVENT_COLUMNS + SCALE_OUT_COLUMNS]
    lines = ["| policy | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for name, e in rows:
        scale_out = e.get("scale_out") or {}
        assert isinstance(scale_out, dict)
        cells = [_cell(e.get(k), d) for k, _, d in EVENT_COLUMNS]
        cells += [_cell(scale_out.get(k), d) for k, _, d in SCALE_OUT_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def nodes_needed_line(needed: Mapping[str, int | None], counts: Sequence[int], attainment: float,
                      load_nodes: int | None = None) -> str:
    """One line; it says when the counts did not serve one workload (each
    scaled its own), which makes the comparison one of loads, not of nodes."""
    if len(counts) < 2:
        return ""
    cells = ", ".join(f"{p} {n if n is not None else f'> {max(counts)}'}" for p, n in needed.items())
    load = (f"all on the load of {load_nodes} nodes" if load_nodes else
            "each count on its own scaled load: give --load-nodes N to compare counts on one workload")
    return (f"nodes needed for SLO attainment >= {attainment:g} (of {', '.join(map(str, counts))} nodes "
            f"simulated, {load}): {cells}")


def load_around_events(loads: Mapping[str, Mapping[str, object]]):
    """loads[policy] = {"first_s": int, "nodes": {node: [busy fraction per s, None while it did not exist]},
    "events": [(kind, at_s, node)]}: one heat map per policy, a row per node."""
    names = [p for p, load in loads.items() if load.get("nodes")]
    figure, axes = plt.subplots(len(names), 1, figsize=(9, 1.2 + 1.6 * max(1, len(names))), sharex=True,
                                squeeze=False)
    image = None
    for ax, name in zip(axes[:, 0], names):
        load = loads[name]
        first = int(load["first_s"])  # type: ignore[call-overload]
        nodes = load["nodes"]
        assert isinstance(nodes, dict)
        order = sorted(nodes, key=lambda n: (len(n), n))
        grid = np.array([[np.nan if x is None else x for x in nodes[n]] for n in order], dtype=float)
        image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest",
                          extent=(first, first + grid.shape[1], len(order) - 0.5, -0.5))
        ax.set_yticks(range(len(order)), order, fontsize=7)
        for kind, at_s, node in load.get("events") or []:  # type: ignore[union-attr]
            ax.axvline(at_s, color="red", linestyle="--", linewidth=1)
            ax.annotate(f"{kind} {node}", (at_s, -0.6), fontsize=8, color="red")
        ax.set_ylabel(name)
    axes[-1, 0].set_xlabel("trace s (white: the node did not exist)")
    axes[0, 0].set_title("per-node busy fraction per second around each node event", pad=14)
    if image is not None:
        figure.colorbar(image, ax=axes[:, 0].tolist(), label="busy fraction", shrink=0.8)
    return figure
