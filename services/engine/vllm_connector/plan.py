"""What the connector loads and saves, per request and per engine step. Pure:
no vLLM, no gRPC; block counts and page ids only.

Invariants:
- a load covers whole blocks past the engine's own prefix-cache hit and
  stops one token short of the prompt (vLLM computes at least the last
  prompt token itself), so at most (prompt_tokens - 1) // block_size blocks
  of a prompt are ever loaded;
- a block is saved once per request, when all of its tokens' KV is computed
  (num_computed_tokens after the step covers it) and its hash is known;
  blocks the engine had (its prefix cache) or loaded are not saved again
  (a pull from a peer lands in the node's kvstore before it is loaded).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from speckv.services.engine.vllm_connector.port import ReadLease


@dataclass(frozen=True, slots=True)
class LoadSpec:
    req_id: str
    page_ids: tuple[int, ...]  # engine pages to fill, in chain order
    block_ids: tuple[int, ...]  # speckv ids, one per page
    # Pinned at lookup (the kvstore's shared pages): block_ids[i] lies at
    # lease position lease_start + i; the worker releases the whole lease.
    lease: ReadLease | None = None
    lease_start: int = 0
    # "": the node's own kvstore holds them; else the peer (a node id of the
    # connector's `peers`) whose kvstore is asked to copy them into the
    # node's (Replicate) before they are loaded from there.
    source: str = ""
    family: str = ""  # the chain's family (its first block id in decimal), for the pull's order


@dataclass(frozen=True, slots=True)
class SaveSpec:
    req_id: str
    page_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    parents: tuple[int | None, ...]  # speckv id of each block's parent; None for a chain's first block
    family: str  # the chain's family in the kvstore: its first block id in decimal


@dataclass
class StepPlan:
    """The worker's orders for one engine step."""

    loads: list[LoadSpec] = field(default_factory=list)  # before this step's forward
    # Beside the steps: their requests wait (WAITING_FOR_REMOTE_KVS) until reported finished.
    async_loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


@dataclass
class RequestTrack:
    """The scheduler's view of one running request."""

    req_id: str
    page_ids: list[int] = field(default_factory=list)
    saved_upto: int = 0  # blocks [0, saved_upto) need no save (engine-cached, loaded or saved)
    pending_loads: list[LoadSpec] = field(default_factory=list)


def loadable_blocks(prompt_tokens: int, block_size: int, known_hashes: int) -> int:
    """Blocks of a prompt a load may cover from the start."""
    return max(0, min(known_hashes, (prompt_tokens - 1) // block_size))


def new_matched_blocks(local_tokens: int, block_size: int, store_prefix: int) -> int:
    """Blocks to load past the engine's own hit of local_tokens (whole blocks)."""
    return max(0, store_prefix - local_tokens // block_size)


def save_spec(track: RequestTrack, ids: list[int], computed_tokens: int, block_size: int) -> SaveSpec | None:
    """The blocks of track that this step completes, advancing saved_upto; None if none."""
    end = min(computed_tokens // block_size, len(ids), len(track.page_ids))
    start = track.saved_upto
    if end <= start:
        return None
    track.saved_upto = end
    parents = tuple(ids[i - 1] if i > 0 else None for i in range(start, end))
    return SaveSpec(track.req_id, tuple(track.page_ids[start:end]), tuple(ids[start:end]), parents,
                    family=str(ids[0]))
