"""RouteObservation (routing/observation.py) on the wire between scheduler
replicas (scheduler.proto's RouteObservation), both ways."""
from __future__ import annotations

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.routing.observation import RouteObservation
from speckv.v1 import scheduler_pb2

MAX_ENTERS_IN_MS = 3_600_000.0  # an hour: no promotion or pull a Route prices takes longer


def observation_to_proto(o: RouteObservation) -> scheduler_pb2.RouteObservation:
    return scheduler_pb2.RouteObservation(
        family=o.family, block_hashes=o.block_hashes, prompt_tokens=o.prompt_tokens, node_id=o.node_id,
        cached_blocks=o.cached_blocks, fetch_blocks=o.fetch_blocks, fetch_from=o.fetch_from or "",
        pull_holder=o.pull_holder or "", prefill_ms=o.prefill_ms, uncached_tokens=o.uncached_tokens,
        arrival_time_s=o.arrival_s, disk_blocks=o.disk_blocks, enters_in_ms=o.enters_in_ms)


def observation_from_proto(m: scheduler_pb2.RouteObservation, where: str) -> RouteObservation:
    """InvalidArgument, naming `where`, for a record no Route could have made."""
    if not m.node_id or m.prompt_tokens <= 0 or not m.family:
        raise InvalidArgument(f"{where}: node_id, family and prompt_tokens > 0 are required")
    if len(m.block_hashes) > m.prompt_tokens or m.cached_blocks + m.fetch_blocks > len(m.block_hashes):
        raise InvalidArgument(f"{where}: {m.cached_blocks} cached + {m.fetch_blocks} fetched blocks of "
                              f"{len(m.block_hashes)} hashes for {m.prompt_tokens} prompt tokens")
    if not (m.prefill_ms >= 0 and m.arrival_time_s >= 0 and 0 <= m.enters_in_ms <= MAX_ENTERS_IN_MS) or \
            m.uncached_tokens > m.prompt_tokens:
        raise InvalidArgument(f"{where}: prefill_ms and arrival_time_s must be >= 0, enters_in_ms in "
                              f"[0, {MAX_ENTERS_IN_MS:g}], uncached_tokens <= prompt_tokens")
    if m.disk_blocks > m.cached_blocks:
        raise InvalidArgument(f"{where}: {m.disk_blocks} disk blocks of {m.cached_blocks} cached blocks")
    return RouteObservation(Family(m.family), list(m.block_hashes), m.prompt_tokens, NodeId(m.node_id),
                            m.cached_blocks, m.fetch_blocks, NodeId(m.fetch_from) if m.fetch_from else None,
                            NodeId(m.pull_holder) if m.pull_holder else None, m.prefill_ms, m.uncached_tokens,
                            m.arrival_time_s, m.disk_blocks, m.enters_in_ms)
