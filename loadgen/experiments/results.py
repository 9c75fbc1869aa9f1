"""The results of a comparison, typed: one policy's summary, the floor, the
comparison of several policies on one slice, and the simulator's rows per node
count. Each is built in one place (metrics.summarize, ttft_floor.floor_summary,
bench e2e's compare, the simulator's assemble) and read by the console table,
the JSON writer and the report alike; `to_json` is the one place that names
the JSON keys.

Units: TTFT and other latencies in ms of the real model's time (the torch
engine's: trace-time ms on this CPU), bytes of the real model, ratios in
[0, 1], times in seconds. None: the figure has no sample (no burst request, no
replica read, ...).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from speckv.loadgen.experiments.e2e_config import SliceSpec

# nodes_needed: the SLO attainment an operator buys nodes to reach.
NODES_NEEDED_ATTAINMENT = 0.99


@dataclass(frozen=True, slots=True)
class LiveRunFigures:
    """What a live policy run adds to its summary."""

    wall_s: float
    kvstore_used_pages: int
    warm_routed: int | None = None  # None: no warm start ran
    warm_stored_blocks: int | None = None
    warm_s: float | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"wall_s": self.wall_s, "kvstore_used_pages": self.kvstore_used_pages}
        if self.warm_routed is not None:
            out.update(warm_routed=self.warm_routed, warm_stored_blocks=self.warm_stored_blocks, warm_s=self.warm_s)
        return out


@dataclass(frozen=True, slots=True)
class SimulatedRunFigures:
    """What a simulation adds to its summary: its cost on this machine."""

    wall_s: float
    cpu_s: float
    simulated_events: int
    events_per_s: float | None  # per CPU second; None when the run recorded no CPU time
    virtual_s: float
    network_bytes: int
    peak_rss_mb: float

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """One policy on one slice (metrics.summarize says how each figure is counted)."""

    requests: int
    served: int
    errors: int
    retried: int
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    burst_requests: int
    burst_ttft_p50_ms: float | None
    burst_ttft_p90_ms: float | None
    burst_ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    e2e_p50_ms: float | None
    slo_attainment: float | None
    prefix_hit_ratio: float
    fetched_requests: int
    bytes_replicated: int
    replica_blocks_committed: int
    replica_blocks_read: int
    replica_hit_ratio: float
    wasted_bytes_ratio: float
    replica_landings: int
    replica_landings_read_ratio: float
    replica_read_lead_s_p50: float | None
    orders: dict[str, int]
    burst_queue_ms_mean: float | None
    burst_cache_lost_ratio: float | None
    burst_recompute_ms_mean: float | None
    # Where latency comes from (None without the floor's reuse figures):
    # returning requests reuse KV computed before beyond the shared prefix.
    returning_requests: int | None = None
    returning_ttft_p50_ms: float | None = None
    returning_ttft_p99_ms: float | None = None
    first_seen_ttft_p99_ms: float | None = None
    # Of the reusable tokens beyond the shared prefix: found on the serving
    # node's device tier, its host tier, loaded off its disk tier, pulled
    # from a peer, recomputed.
    reuse_recovered_ratio: float | None = None
    device_hit_ratio: float | None = None
    host_hit_ratio: float | None = None
    disk_load_ratio: float | None = None
    peer_pull_ratio: float | None = None
    recompute_ratio: float | None = None
    # Mean ms a request waited for its host-tier hits to be promoted (no disk
    # block among them) / for a promotion that read disk blocks first / for its pull.
    promotion_ms_mean: float | None = None
    disk_load_ms_mean: float | None = None
    pull_ms_mean: float | None = None
    # (none - policy) / (none - floor) on the returning p99; set by the comparison.
    avoidable_closed: float | None = None
    # Speculative actions by kind (replicate, prefetch): orders, bytes, the
    # saving expected at planning time and what they came to (outcomes.py).
    actions: dict[str, dict[str, object]] | None = None
    # Per-node busy time and overload (utilisation.py): overload_idle_share, busy_cv.
    utilisation: dict[str, object] | None = None
    # Node events of the run (event_metrics.py), in time order; None: a run without events.
    events: list[dict[str, object]] | None = None
    live: LiveRunFigures | None = None
    simulated: SimulatedRunFigures | None = None
    # Figure name -> (low, high): its 95 % bootstrap interval over the run's
    # requests (bootstrap.bootstrap_intervals), for the figures that are
    # statistics of requests; None: not computed for this run.
    ci95: dict[str, tuple[float, float]] | None = None
    # Figure name -> (low, high): the 95 % interval of this policy's figure
    # minus the baseline's (`none`) on the same requests, a paired bootstrap
    # (bootstrap.paired_intervals); None: the baseline itself, or not paired.
    ci95_vs_none: dict[str, tuple[float, float]] | None = None
    # Figure name -> its value in each of the repeated live runs of this
    # policy (bench e2e --repeats; repeats.py), this summary's run first;
    # None: one run.
    repeats: dict[str, list[float]] | None = None

    def to_json(self) -> dict[str, object]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("live", "simulated", "ci95", "ci95_vs_none", "repeats")}
        out["orders"] = dict(self.orders)
        for name in ("ci95", "ci95_vs_none"):
            intervals = getattr(self, name)
            if intervals is not None:
                out[name] = {figure: [low, high] for figure, (low, high) in intervals.items()}
        if self.repeats is not None:
            out["repeats"] = {name: list(values) for name, values in self.repeats.items()}
        for extra in (self.live, self.simulated):
            if extra is not None:
                out.update(extra.to_json())
        return out


@dataclass(frozen=True, slots=True)
class FloorSummary:
    """The TTFT no placement can beat (ttft_floor.py), under a policy summary's names."""

    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    burst_ttft_p99_ms: float | None
    returning_ttft_p99_ms: float | None = None

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def with_avoidable_closed(policies: dict[str, PolicySummary],
                          floor: FloorSummary | None) -> dict[str, PolicySummary]:
    """Each policy's share of the avoidable returning-request p99 it closes:
    (none - policy) / (none - floor). None without `none` in the comparison,
    without the figures, or when none is already at the floor."""
    base = policies.get("none")
    top = base.returning_ttft_p99_ms if base else None
    bottom = floor.returning_ttft_p99_ms if floor else None
    if top is None or bottom is None or top <= bottom:
        return policies
    return {name: s if s.returning_ttft_p99_ms is None else
            dataclasses.replace(s, avoidable_closed=(top - s.returning_ttft_p99_ms) / (top - bottom))
            for name, s in policies.items()}


def figure_of(row: PolicySummary | FloorSummary | None, key: str) -> object:
    """row's figure named key, or None when the row has no such figure (the floor has few)."""
    return getattr(row, key, None) if row is not None else None


@dataclass(frozen=True, slots=True)
class ScaleRow:
    """The simulator's result at one node count."""

    policies: dict[str, PolicySummary]
    requests: int
    notes: list[str]
    floor: FloorSummary | None

    def to_json(self) -> dict[str, object]:
        return {"policies": {name: s.to_json() for name, s in self.policies.items()}, "requests": self.requests,
                "notes": list(self.notes), "floor": self.floor.to_json() if self.floor else None}


@dataclass(frozen=True, slots=True)
class LiveSetup:
    """What a live comparison ran on beyond the shared fields."""

    engine: str
    kvstore_bytes_per_block: int
    family: str
    predictor_model: str


@dataclass(frozen=True, slots=True)
class SimulatedTotals:
    """What a simulated comparison adds: its cost and every node count's row."""

    wall_s: float
    simulated_events: int
    code: str  # "mypyc", "python" or both
    cpu_s: float
    events_per_s: float | None
    peak_rss_mb: float
    by_nodes: dict[str, ScaleRow]
    machine: dict[str, object] = field(default_factory=dict)
    load_nodes: int | None = None  # every node count served the load sized for this many nodes; None: each its own

    def nodes_needed(self, min_attainment: float = NODES_NEEDED_ATTAINMENT) -> dict[str, int | None]:
        """Per policy, the smallest simulated node count whose SLO attainment
        is >= min_attainment (None: none of them reached it)."""
        out: dict[str, int | None] = {}
        for n in sorted(self.by_nodes, key=int):
            for name, s in self.by_nodes[n].policies.items():
                out.setdefault(name, None)
                if out[name] is None and s.slo_attainment is not None and s.slo_attainment >= min_attainment:
                    out[name] = int(n)
        return out

    def scale(self) -> dict[str, dict[str, dict[str, object]]]:
        """Burst p99 and bytes replicated per policy and node count."""
        return {n: {p: {"burst_ttft_p99_ms": s.burst_ttft_p99_ms, "bytes_replicated": s.bytes_replicated}
                    for p, s in row.policies.items()} for n, row in self.by_nodes.items()}


@dataclass(frozen=True, slots=True)
class Comparison:
    """Several policies on one slice of one workload, on one configuration."""

    trace: str
    slice: SliceSpec
    ttft_target_ms: float
    byte_scale_factor: int
    nodes: int
    engine_profile: str
    link_gbps: float
    real_bytes_per_block: int
    burst_seconds_in_trace: int
    policies: dict[str, PolicySummary]
    floor: FloorSummary | None
    notes: list[str]
    live: LiveSetup | None = None
    simulated: SimulatedTotals | None = None
    host_pages: int = 0  # each node's host tier, blocks (0: none)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "trace": self.trace, "slice": dataclasses.asdict(self.slice), "ttft_target_ms": self.ttft_target_ms,
            "byte_scale_factor": self.byte_scale_factor, "nodes": self.nodes, "engine_profile": self.engine_profile,
            "link_gbps": self.link_gbps, "host_pages": self.host_pages,
            "real_bytes_per_block": self.real_bytes_per_block,
            "burst_seconds_in_trace": self.burst_seconds_in_trace,
            "policies": {name: s.to_json() for name, s in self.policies.items()},
            "floor": self.floor.to_json() if self.floor else None,
        }
        if self.live is not None:
            out.update(dataclasses.asdict(self.live))
        sim = self.simulated
        if sim is not None:
            out.update({"simulated": True, "wall_s": sim.wall_s, "simulated_events": sim.simulated_events,
                        "code": sim.code, "cpu_s": sim.cpu_s, "events_per_s": sim.events_per_s,
                        "peak_rss_mb": sim.peak_rss_mb,
                        "by_nodes": {n: row.to_json() for n, row in sim.by_nodes.items()}, "scale": sim.scale(),
                        "nodes_needed": {"min_slo_attainment": NODES_NEEDED_ATTAINMENT, "load_nodes": sim.load_nodes,
                                         "node_counts": sorted(map(int, sim.by_nodes)),
                                         "policies": sim.nodes_needed()}})
        out["notes"] = list(self.notes)
        if sim is not None:
            out["machine"] = sim.machine
        return out

    def at_nodes(self, nodes: str) -> Comparison:
        """The comparison as seen at one of its simulated node counts (its report)."""
        if self.simulated is None:
            raise ValueError("only a simulated comparison has rows per node count")
        row = self.simulated.by_nodes[nodes]
        return dataclasses.replace(self, nodes=int(nodes), policies=row.policies, floor=row.floor,
                                   notes=row.notes + self.notes[-1:])

