"""End-to-end metrics of one policy run, from per-request records.

Definitions (the same for every policy):
- Percentiles are NumPy's default (linear interpolation between order
  statistics) over requests that got a first token; TTFT in ms of the real
  model's time.
- Burst windows: whole trace seconds (floor of the arrival time). Over every
  second of the whole trace, empty ones included, the threshold is the count
  of the ceil(5 %)-th busiest second; every second with at least that many
  arrivals (and at least one) is a burst second. Fixed from the trace alone,
  never from a run. burst_ttft_* are over requests arriving in those seconds.
- SLO attainment: share of requests (errors count as misses) with TTFT at
  most the target.
- Replica hit ratio: share of served requests whose cached prefix on the
  serving node included at least one block committed there by a replication
  order. Wasted bytes ratio: replicated blocks never read / replicated blocks
  (0 when nothing was replicated). The hit ratio is bounded by landings /
  served requests: a conversation family rarely brings more than one
  request while a replica is fresh, so it reads low even when every replica
  is used; replica_landings_read_ratio (landings, one per order and target,
  any of whose blocks a request read) and replica_read_lead_s_p50 (trace
  seconds from commit to first read, over landings read) say whether the
  replicas themselves were useful. Bytes are the real model's (stored bytes x
  the byte scale factor).
- Where burst time goes (given each request's reusable tokens from
  loadgen/experiments/ttft_floor.py, keyed by request id): burst_queue_ms_mean is the
  mean wait before a burst request's prefill; burst_cache_lost_ratio is the
  share of served burst requests that prefilled tokens the trace had already
  computed (cached + fetched < reusable: that KV was evicted, or sat on a node
  the request was not served on); burst_recompute_ms_mean is the mean prefill
  time those lost tokens cost. None without reusable tokens.
- Intervals (bootstrap.py): the figures that are statistics of the
  requests get a percentile bootstrap interval over requests; totals of the
  run (bytes, orders, replicas) get none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from speckv.loadgen.experiments.replica_ledger import ReplicaTotals
from speckv.loadgen.experiments.results import PolicySummary
from speckv.services.common.engine_profile import EngineProfile

BURST_TOP_FRACTION = 0.05
# Burst seconds at most this far apart are one burst (burst_runs).
BURST_GAP_S = 2


@dataclass(slots=True)
class RequestRecord:
    """One replayed request. Times: trace seconds and real-model ms."""

    request_id: str
    arrival_s: float  # trace time
    family: str
    prompt_tokens: int
    output_tokens: int
    node_id: str = ""
    cached_tokens: int = 0  # on the serving node at dispatch, in either tier
    fetched_tokens: int = 0  # pulled from fetch_from before prefill
    promoted_tokens: int = 0  # of cached_tokens, those only its host tier held (promoted before prefill)
    disk_tokens: int = 0  # of promoted_tokens, those only its disk tier held (read off the disk first)
    promote_ms: float = 0.0  # host-to-device copy before prefill (real-model ms)
    fetch_ms: float = 0.0  # pull from fetch_from before prefill (real-model ms)
    fetch_from: str = ""
    expected_ttft_ms: float = 0.0  # the scheduler's estimate
    route_ms: float = 0.0  # wall time of the Route call
    queue_ms: float = 0.0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    replica_blocks: int = 0  # cached blocks that were speculative replicas
    retried: bool = False
    error: str = ""

    @property
    def served(self) -> bool:
        return self.ttft_ms is not None and not self.error


def request_key(index: int) -> str:
    """The id of the index-th replayed request of a slice (live and simulated alike)."""
    return f"r{index}"


def burst_seconds(arrivals_s: Iterable[float], top_fraction: float = BURST_TOP_FRACTION) -> frozenset[int]:
    """The trace's burst seconds (see the module docstring)."""
    seconds = np.floor(np.asarray(list(arrivals_s), dtype=float)).astype(int)
    if seconds.size == 0:
        return frozenset()
    counts = np.bincount(seconds - seconds.min())
    k = max(1, math.ceil(top_fraction * counts.size))
    threshold = max(1, int(np.sort(counts)[::-1][k - 1]))
    return frozenset(int(s) + int(seconds.min()) for s in np.nonzero(counts >= threshold)[0])


def burst_runs(bursts: frozenset[int], gap: int = BURST_GAP_S) -> list[tuple[int, int]]:
    """The bursts as [first, last] trace seconds, in time order: burst seconds
    at most `gap` apart belong to one burst."""
    runs: list[list[int]] = []
    for second in sorted(bursts):
        if runs and second - runs[-1][1] <= gap:
            runs[-1][1] = second
        else:
            runs.append([second, second])
    return [(first, last) for first, last in runs]


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def summarize(records: Sequence[RequestRecord], bursts: frozenset[int], ttft_target_ms: float,
              replicas: ReplicaTotals, bytes_per_block: int, orders: dict[str, int],
              reusable_tokens: Mapping[str, int] | None = None,
              profile: EngineProfile | None = None,
              shared_tokens: Mapping[str, int] | None = None) -> PolicySummary:
    """The per-policy summary. reusable_tokens (request id -> tokens) and
    profile give the burst breakdown; with shared_tokens (request id -> its
    reusable tokens of the prefix every request shares) too, the
    returning/first-seen split and where reused tokens came from."""
    served = [r for r in records if r.served]
    ttft = [r.ttft_ms for r in served]
    burst = [r.ttft_ms for r in served if math.floor(r.arrival_s) in bursts]
    in_burst = sum(1 for r in records if math.floor(r.arrival_s) in bursts)
    committed = replicas.committed_blocks
    queue_ms, lost_ratio, recompute_ms = _burst_breakdown([r for r in served if math.floor(r.arrival_s) in bursts],
                                                          reusable_tokens, profile)
    return PolicySummary(
        requests=len(records),
        served=len(served),
        errors=len(records) - len(served),
        retried=sum(1 for r in records if r.retried),
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p90_ms=percentile(ttft, 90),
        ttft_p99_ms=percentile(ttft, 99),
        burst_requests=in_burst,
        burst_ttft_p50_ms=percentile(burst, 50),
        burst_ttft_p90_ms=percentile(burst, 90),
        burst_ttft_p99_ms=percentile(burst, 99),
        tpot_p50_ms=percentile([r.tpot_ms for r in served if r.tpot_ms], 50),
        e2e_p50_ms=percentile([r.e2e_ms for r in served], 50),
        slo_attainment=(sum(1 for t in ttft if t <= ttft_target_ms) / len(records)) if records else None,
        prefix_hit_ratio=(sum(r.cached_tokens + r.fetched_tokens for r in served)
                          / max(1, sum(r.prompt_tokens for r in served))),
        fetched_requests=sum(1 for r in served if r.fetched_tokens),
        bytes_replicated=committed * bytes_per_block,
        replica_blocks_committed=committed,
        replica_blocks_read=replicas.read_blocks,
        replica_hit_ratio=(sum(1 for r in served if r.replica_blocks) / len(served)) if served else 0.0,
        wasted_bytes_ratio=replicas.wasted_blocks / committed if committed else 0.0,
        replica_landings=len(replicas.fates),
        replica_landings_read_ratio=(sum(1 for f in replicas.fates if f.read_blocks) / len(replicas.fates)
                                     if replicas.fates else 0.0),
        replica_read_lead_s_p50=percentile([f.first_read_s - f.committed_s for f in replicas.fates
                                            if f.first_read_s is not None], 50),
        orders=dict(orders),
        burst_queue_ms_mean=queue_ms, burst_cache_lost_ratio=lost_ratio, burst_recompute_ms_mean=recompute_ms,
        **_reuse_figures(served, reusable_tokens, shared_tokens),
    )


def _burst_breakdown(burst: Sequence[RequestRecord], reusable_tokens: Mapping[str, int] | None,
                     profile: EngineProfile | None) -> tuple[float | None, float | None, float | None]:
    """(mean queueing ms, share that recomputed reusable KV, mean ms that recompute cost) of burst requests."""
    queue = float(np.mean([r.queue_ms for r in burst])) if burst else None
    if reusable_tokens is None or profile is None or not burst:
        return queue, None, None
    lost, recompute = 0, 0.0
    for r in burst:
        reusable = reusable_tokens.get(r.request_id, 0)
        reused = r.cached_tokens + r.fetched_tokens
        if reused < reusable:
            lost += 1
            recompute += (profile.prefill_ms(r.prompt_tokens - reused, reused)
                          - profile.prefill_ms(r.prompt_tokens - reusable, reusable))
    return queue, lost / len(burst), recompute / len(burst)


def reuse_figures(served: Sequence[RequestRecord], reusable_tokens: Mapping[str, int] | None,
                  shared_tokens: Mapping[str, int] | None) -> dict[str, float | int | None]:
    """_reuse_figures for any subset of served requests (one node's, one window's)."""
    return _reuse_figures(served, reusable_tokens, shared_tokens)


def _reuse_figures(served: Sequence[RequestRecord], reusable_tokens: Mapping[str, int] | None,
                   shared_tokens: Mapping[str, int] | None) -> dict[str, float | int | None]:
    """The returning/first-seen split and the sources of reused tokens (results.PolicySummary).

    Per request, of its R reusable tokens the first S are the shared prefix;
    the node's cache covers the first c = min(cached, R) tokens and a pull
    extends that to u = min(cached + fetched, R). Beyond S the node's hits are
    max(0, c - S), of which the tiers below the device's are
    b = min(promoted, max(0, c - S)) (the shared prefix is in every node's
    device tier: it is used by every request), min(disk, b) of those loaded
    off its disk and the rest its host tier's hits, and the rest the device
    tier's; peer pulls are
    max(0, u - max(c, S)); the rest is recomputed. Promotion, disk-load and
    pull times are means over the requests that waited for one and whose wait
    was timed (a promotion with any disk block is a disk load's)."""
    if reusable_tokens is None or shared_tokens is None:
        return {}
    returning, first_seen = [], []
    beyond = device = host = disk = peer = 0
    for r in served:
        split = reuse_split(r, reusable_tokens, shared_tokens)
        (returning if split[0] > 0 else first_seen).append(r.ttft_ms)
        beyond += split[0]
        device += split[1]
        host += split[2]
        disk += split[3]
        peer += split[4]
    # Only runs that time the waits fill these (the simulator; the live replay does not yet): none timed is None.
    promotes = [r.promote_ms for r in served if r.promoted_tokens and not r.disk_tokens and r.promote_ms > 0]
    loads = [r.promote_ms for r in served if r.disk_tokens and r.promote_ms > 0]
    pulls = [r.fetch_ms for r in served if r.fetched_tokens and r.fetch_ms > 0]
    return {"returning_requests": len(returning), "returning_ttft_p50_ms": percentile(returning, 50),
            "returning_ttft_p99_ms": percentile(returning, 99), "first_seen_ttft_p99_ms": percentile(first_seen, 99),
            "reuse_recovered_ratio": _ratio(device + host + disk + peer, beyond),
            "device_hit_ratio": _ratio(device, beyond), "host_hit_ratio": _ratio(host, beyond),
            "disk_load_ratio": _ratio(disk, beyond), "peer_pull_ratio": _ratio(peer, beyond),
            "recompute_ratio": _ratio(beyond - device - host - disk - peer, beyond),
            "promotion_ms_mean": float(np.mean(promotes)) if promotes else None,
            "disk_load_ms_mean": float(np.mean(loads)) if loads else None,
            "pull_ms_mean": float(np.mean(pulls)) if pulls else None}


def reuse_split(r: RequestRecord, reusable_tokens: Mapping[str, int],
                shared_tokens: Mapping[str, int]) -> tuple[int, int, int, int, int]:
    """One request's reusable tokens beyond its shared prefix and where they
    came from: (beyond, device, host, disk, peer) by _reuse_figures' rule
    (the rest of beyond was recomputed). beyond > 0 exactly when r is a
    returning request."""
    total = reusable_tokens.get(r.request_id, 0)
    shared = min(shared_tokens.get(r.request_id, 0), total)
    cached = min(r.cached_tokens, total)
    used = min(r.cached_tokens + r.fetched_tokens, total)
    hits = max(0, cached - shared)
    from_host = min(r.promoted_tokens, hits)
    from_disk = min(r.disk_tokens, from_host)
    return total - shared, hits - from_host, from_host - from_disk, from_disk, max(0, used - max(cached, shared))


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def is_returning(request_id: str, reusable_tokens: Mapping[str, int], shared_tokens: Mapping[str, int]) -> bool:
    """As _reuse_figures splits them: it reuses tokens beyond the shared prefix."""
    total = reusable_tokens.get(request_id, 0)
    return total > min(shared_tokens.get(request_id, 0), total)
