"""Trace requests as token-id prompts for real vLLM engines, named by the
block ids SpeckvConnector gives their KV, and the router's jobs for them
(`speckv bench e2e --engine vllm`).

Scale: each full trace block (the trace's block_tokens, 512 in Mooncake's)
becomes one engine block of block_size tokens (32: vLLM's CPU attention
needs a multiple of 32), the partial tail and the output shrink by the same
factor (torch_kv.model_scale), and a prompt that would not fit
max_model_len loses trailing blocks. A block's tokens are drawn from a
generator seeded by its trace id (torch_kv.trace_tokens), so requests that
share a trace prefix share tokens and therefore vLLM's block hashes; the
tail is seeded by the request (family, arrival, length).

Identity: the scaled request's block ids are replaced by the connector's
ids for those tokens (vLLM's sha256 block chain under the engine's KV
layout digest, identity.py), so the router's Route, the scheduler's index
(fed by the kvstores' events of what the connector saved), the oracle's
trace and the replica ledger all speak of the same blocks. The rename keeps
each id's tokens, so a job's prompt is rebuilt from its request alone.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Callable, Sequence

from speckv.loadgen.engines.torch_kv import model_scale, trace_tokens
from speckv.loadgen.engines.vllm_server import VllmJob
from speckv.services.common.engine_profile import EngineProfile
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.traces import TraceRequest

if TYPE_CHECKING:
    from speckv.loadgen.experiments.reference_router import Placement



def chain_block_ids(model_id: str, geometry: KVGeometry, tokens: Sequence[int]) -> list[int]:
    """The connector's ids of the prompt's full blocks in an engine of this
    geometry (CPU page layout, rank 0, sha256), computed without an engine."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    from speckv.services.engine.vllm_connector.identity import DEFAULT_HASH_ALGO, block_ids

    size = geometry.block_size
    hash_fn = get_hash_fn_by_name(DEFAULT_HASH_ALGO)
    kv_cache_utils.init_none_hash(hash_fn)
    parent, hashes = None, []
    for start in range(0, len(tokens) - size + 1, size):
        parent = kv_cache_utils.hash_block_tokens(hash_fn, parent, list(tokens[start:start + size]), None)
        hashes.append(parent)
    return block_ids(layout_digest(model_id, geometry), hashes)


def layout_digest(model_id: str, geometry: KVGeometry) -> bytes:
    """The layout digest of the connector in an engine of this geometry (identity.cpu_layout)."""
    from speckv.services.engine.vllm_connector.identity import cpu_layout

    return cpu_layout(model_id, geometry).digest()


# tokens of whole blocks -> the connector's id of each block
BlockIds = Callable[[Sequence[int]], list[int]]


class VllmPrompts:
    """Scales and renames trace requests (module docstring) and rebuilds a
    renamed request's tokens. ids: how a prompt's whole blocks are named
    (None: chain_block_ids of model_id and geometry, what the connector of
    an engine of that geometry saves them under)."""

    def __init__(self, model_id: str, geometry: KVGeometry, vocab_size: int, max_model_len: int,
                 ids: BlockIds | None = None) -> None:
        self._geometry = geometry
        self._vocab, self._max_len = vocab_size, max_model_len
        self._ids: BlockIds = ids or (lambda tokens: chain_block_ids(model_id, geometry, tokens))
        self._block_tokens: dict[int, tuple[int, ...]] = {}  # connector id -> its block's tokens
        self._tails: dict[tuple[str, float, int], tuple[int, ...]] = {}

    def scale(self, requests: Sequence[TraceRequest]) -> list[TraceRequest]:
        return [self._one(r) for r in requests]

    def tokens(self, request: TraceRequest) -> tuple[int, ...]:
        """The prompt of a request that scale() returned."""
        try:
            blocks = [self._block_tokens[h] for h in request.block_hashes[:request.full_blocks]]
            tail = self._tails[_tail_key(request)]
        except KeyError:
            raise InvalidArgument(f"request of family {request.family!r} at {request.arrival_s} s was not scaled "
                                  "by these prompts") from None
        return tuple(t for block in blocks for t in block) + tail

    def _one(self, request: TraceRequest) -> TraceRequest:
        size = self._geometry.block_size
        scaled = model_scale(request, size, self._max_len)
        seed = int.from_bytes(hashlib.blake2b(repr(_tail_key(scaled)).encode(), digest_size=8).digest(), "little")
        tokens = trace_tokens(scaled.block_hashes, scaled.prompt_tokens, size, size, self._vocab, seed)
        full = scaled.full_blocks
        ids = self._ids(tokens[:full * size])
        for i, block_id in enumerate(ids):
            self._block_tokens[block_id] = tuple(tokens[i * size:(i + 1) * size])
        renamed = dataclasses.replace(scaled, block_hashes=tuple(ids))
        self._tails[_tail_key(renamed)] = tuple(tokens[full * size:])
        return renamed


def _tail_key(request: TraceRequest) -> tuple[str, float, int]:
    return request.family, request.arrival_s, request.prompt_tokens


class VllmJobs:
    """The router's job factory for VllmServerEngines (reference_router.
    JobFactory): the engines' connectors read and write the kvstores
    themselves, and solo_prefill_ms is the engine's fitted profile's
    estimate of the job's own prefill (what is not queueing), since the
    server does not say when a request's prefill started."""

    owns_kv = True

    def __init__(self, prompts: VllmPrompts, profile: EngineProfile) -> None:
        self._prompts, self._profile = prompts, profile

    def make_job(self, request_id: str, request: TraceRequest, output_tokens: int, placement: Placement) -> VllmJob:
        tokens = self._prompts.tokens(request)
        if placement is None or placement.fetched_tokens <= 0:
            return VllmJob(request_id, len(tokens), output_tokens, tokens=tokens)
        return VllmJob(request_id, len(tokens), output_tokens, tokens=tokens, pull_from=placement.fetch_from,
                       route_cached_tokens=placement.cached_tokens, route_fetch_tokens=placement.fetched_tokens)

    def solo_prefill_ms(self, job: VllmJob) -> float:
        skipped = job.cached_tokens + job.fetch_tokens  # a pull's tokens were not computed either
        return self._profile.prefill_ms(job.prompt_tokens - skipped, skipped)
