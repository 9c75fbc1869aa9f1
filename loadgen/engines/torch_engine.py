"""A real inference engine: the TinyGPT decoder (loadgen/engines/torch_model.py)
behind the same `Engine` protocol as the emulated engine, with its KV going
through the node's kvstore.

Algorithm (FCFS continuous batching, one sequence per model call):
- submit queues a TorchJob (its prompt token ids; block ids are the chained
  token hashes, or ids the caller vouches for, e.g. a trace's hash_ids;
  TorchJobs makes them from routed trace requests).
- A step starts when the engine is free and work is ready. It first decodes
  one token for every running sequence (up to max_num_seqs), then prefills
  waiting sequences that were ready when it started, in arrival order, with
  at most prefill_blocks_per_step chunks. A chunk is one KV block
  (block_size tokens at a block-aligned position) or the prompt's partial
  tail: that alignment is what makes reused KV bit-exact (see torch_model's
  determinism contract).
- Admission (a sequence's first prefill step): Lookup the prompt's block ids
  on this node's kvstore; read the cached prefix back (GetBlocks) into the
  sequence's cache; when the job names a peer (fetch_from) holding more of the
  prefix, read those blocks from the peer too. At most (n - 1) // block_size
  blocks are reused so the last prompt token is always computed (its logits
  give the first token). A block that vanished between Lookup and GetBlocks,
  or a peer that fails, just means recomputing from there.
- When a prompt is done: greedy first token (FIRST_TOKEN), and the prompt's
  full blocks that did not come from this node's kvstore are written to it
  (PutBlocks, canonical layout, parent = previous block id). Each later step
  yields one greedy token; FINISHED after output_tokens tokens.

Time: no clock reads. A step starts at an engine-clock time (`now` from the
caller), runs for real, and ends at start + (its measured duration on the
injected `timer`) x time_scale; its events are released by the first
advance(now) at or after that end. time_scale converts the timer's seconds
into the engine clock's (e.g. a replay's trace seconds per wall second).
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping

import grpc
import numpy as np
import torch

from speckv.loadgen.engines.emulated import EngineEvent, EngineEventKind, EngineJob, EngineLoad, Phase
from speckv.loadgen.engines.torch_kv import BlockStore, GrpcBlockStore, StoredBlock, chain_hashes, trace_tokens
from speckv.loadgen.engines.torch_model import KVCache, ModelSpec, TinyGPT
from speckv.services.common.errors import InvalidArgument, SpeckvError
from speckv.services.common.ids import BlockHash

if TYPE_CHECKING:
    from speckv.loadgen.experiments.reference_router import Placement
    from speckv.services.common.traces import TraceRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TorchLimits:
    """Per-step budgets: prefill chunks (blocks) and running sequences."""

    prefill_blocks_per_step: int = 8
    max_num_seqs: int = 16

    def __post_init__(self) -> None:
        if self.prefill_blocks_per_step <= 0 or self.max_num_seqs <= 0:
            raise InvalidArgument("torch limits: prefill_blocks_per_step and max_num_seqs must be > 0")


@dataclass(slots=True)
class TorchJob(EngineJob):
    """An EngineJob with real tokens. prompt_tokens must equal len(tokens).
    After admission cached_tokens / fetch_tokens hold what was really reused
    (this node / the peer), not the route's estimate."""

    tokens: tuple[int, ...] = ()
    block_hashes: tuple[int, ...] = ()  # empty: chained hashes of the tokens
    family: str = ""
    fetch_from: str = ""  # peer node id to read missing prefix blocks from
    output_ids: list[int] = field(default_factory=list)
    prefill_start_s: float | None = None  # engine clock: start of its first prefill step
    reused_blocks: int = 0  # read from this node's kvstore
    fetched_blocks: int = 0  # read from fetch_from
    computed_tokens: int = 0  # prompt tokens run through the model
    stored_blocks: int = 0  # written to this node's kvstore after prefill


@dataclass(slots=True)
class _Sequence:
    job: TorchJob
    cache: KVCache
    hashes: list[BlockHash] = field(default_factory=list)
    admitted: bool = False


@dataclass(slots=True)
class _Done:
    end_s: float
    events: list[EngineEvent]


class TorchEngine:
    """One node's engine. Not thread-safe: the caller serializes calls (the
    live driver holds its lock around them)."""

    def __init__(self, node_id: str, model: TinyGPT, store: BlockStore, block_size: int,
                 limits: TorchLimits = TorchLimits(), peers: Mapping[str, BlockStore] | None = None,
                 timer: Callable[[], float] = time.perf_counter, time_scale: float = 1.0) -> None:
        if block_size <= 0 or time_scale <= 0:
            raise InvalidArgument("torch engine: block_size and time_scale must be > 0")
        self.node_id = node_id
        self.model, self.geometry = model, model.spec.kv_geometry(block_size)
        self._store, self._peers = store, dict(peers or {})
        self._limits, self._timer, self._scale = limits, timer, time_scale
        self._salt = model.spec.fingerprint()
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._done: _Done | None = None  # the last step's events, until its end is reached
        self._free_s = 0.0
        self.steps = 0
        self.computed_tokens = 0  # prompt tokens computed, all jobs

    @property
    def block_size(self) -> int:
        return self.geometry.block_size

    # --- Engine protocol ----------------------------------------------------------
    def submit(self, job: EngineJob, now: float) -> None:
        if not isinstance(job, TorchJob):
            raise InvalidArgument(f"job {job.request_id}: the torch engine needs a TorchJob (token ids)")
        if not job.tokens or job.prompt_tokens != len(job.tokens) or job.output_tokens < 0:
            raise InvalidArgument(f"job {job.request_id}: needs tokens, prompt_tokens == len(tokens), "
                                  "output_tokens >= 0")
        if len(job.tokens) + job.output_tokens > self.model.spec.max_positions:
            raise InvalidArgument(f"job {job.request_id}: {len(job.tokens)} + {job.output_tokens} tokens exceed "
                                  f"max_positions={self.model.spec.max_positions}")
        if job.fetch_from and job.fetch_from not in self._peers:
            raise InvalidArgument(f"job {job.request_id}: fetch_from={job.fetch_from!r} is not a known peer")
        job.submitted_s = job.ready_s = now
        job.phase = Phase.WAITING
        self._waiting.append(_Sequence(job, KVCache(self.model.spec, len(job.tokens) + max(1, job.output_tokens))))

    def advance(self, now: float) -> list[EngineEvent]:
        """Releases the events of steps ended by `now`; runs (for real) each
        step that can start by `now` once the previous one has ended."""
        released: list[EngineEvent] = []
        while True:
            if self._done is not None:
                if self._done.end_s > now:
                    return released
                released.extend(self._done.events)
                self._done = None
            start = self._next_start()
            if start is None or start > now:
                return released
            began = self._timer()
            events = self._step(start)
            end = start + (self._timer() - began) * self._scale
            self._free_s = end
            for event in events:
                event.time_s = end
                if event.kind is EngineEventKind.FIRST_TOKEN:
                    event.job.first_token_s = end
                else:
                    event.job.finished_s = end
            self._done = _Done(end, events)

    def next_event_s(self) -> float | None:
        if self._done is not None:
            return self._done.end_s
        return self._next_start()

    def load(self) -> EngineLoad:
        return EngineLoad(
            queued_tokens=sum(len(s.job.tokens) - s.cache.length for s in self._waiting),
            running_tokens=sum(s.cache.length for s in self._running),
            waiting_requests=len(self._waiting), running_requests=len(self._running))

    # --- stepping -------------------------------------------------------------
    def _next_start(self) -> float | None:
        if self._running:
            return self._free_s
        if self._waiting:
            return max(self._free_s, min(s.job.ready_s for s in self._waiting))
        return None

    def _step(self, start: float) -> list[EngineEvent]:
        """One batch starting at `start`: a token per running sequence, then
        prefill chunks of sequences ready by then."""
        self.steps += 1
        events: list[EngineEvent] = []
        decodes = self._running[:self._limits.max_num_seqs]
        for seq in decodes:
            self._emit(seq, self._greedy(self.model.forward_chunk([seq.job.output_ids[-1]], seq.cache)))
            if seq.job.tokens_out >= seq.job.output_tokens:
                events.append(self._finish(seq))
        budget, seats = self._limits.prefill_blocks_per_step, self._limits.max_num_seqs - len(decodes)
        for seq in list(self._waiting):
            # Waiting is in submission order, so ready times only grow along it.
            if budget <= 0 or seats <= 0 or seq.job.ready_s > start:
                break
            seats -= 1
            if not seq.admitted:
                seq.job.prefill_start_s = start
                self._admit(seq)
            logits = None
            while budget > 0 and seq.cache.length < len(seq.job.tokens):
                logits = self._prefill_chunk(seq)
                budget -= 1
            if logits is not None and seq.cache.length == len(seq.job.tokens):
                events.extend(self._prompt_done(seq, logits))
        return events

    def _prefill_chunk(self, seq: _Sequence) -> torch.Tensor:
        start = seq.cache.length
        end = min(start + self.block_size, len(seq.job.tokens))
        logits = self.model.forward_chunk(list(seq.job.tokens[start:end]), seq.cache)
        seq.job.computed_tokens += end - start
        seq.job.prefilled += end - start
        self.computed_tokens += end - start
        return logits

    def _prompt_done(self, seq: _Sequence, logits: torch.Tensor) -> list[EngineEvent]:
        job = seq.job
        self._waiting.remove(seq)
        self._store_prompt_blocks(seq)
        self._emit(seq, self._greedy(logits))
        events = [EngineEvent(EngineEventKind.FIRST_TOKEN, job, 0.0)]
        if job.tokens_out >= job.output_tokens:
            events.append(self._finish(seq))
        else:
            job.phase = Phase.DECODING
            self._running.append(seq)
        return events

    def _emit(self, seq: _Sequence, token: int) -> None:
        seq.job.output_ids.append(token)
        seq.job.tokens_out += 1

    @staticmethod
    def _greedy(logits: torch.Tensor) -> int:
        return int(torch.argmax(logits).item())

    def _finish(self, seq: _Sequence) -> EngineEvent:
        if seq in self._running:
            self._running.remove(seq)
        seq.job.phase = Phase.DONE
        return EngineEvent(EngineEventKind.FINISHED, seq.job, 0.0)

    # --- KV through the kvstore -----------------------------------------------
    def _admit(self, seq: _Sequence) -> None:
        """Fills the cache with the reusable prefix: this node's, then the peer's."""
        seq.admitted = True
        job, size = seq.job, self.block_size
        hashes = list(job.block_hashes) if job.block_hashes else chain_hashes(job.tokens, size, self._salt)
        seq.hashes = [BlockHash(h) for h in hashes[:len(job.tokens) // size]]
        usable = seq.hashes[:(len(job.tokens) - 1) // size]
        job.reused_blocks = self._read_prefix(seq, self._store, usable, "local")
        if job.fetch_from and job.reused_blocks < len(usable):
            job.fetched_blocks = self._read_prefix(seq, self._peers[job.fetch_from], usable, job.fetch_from)
        job.cached_tokens, job.fetch_tokens = job.reused_blocks * size, job.fetched_blocks * size

    def _read_prefix(self, seq: _Sequence, store: BlockStore, usable: list[BlockHash], where: str) -> int:
        """Reads the blocks of `usable` that `store` holds right after those
        already in the cache; returns how many were loaded (0 on any failure)."""
        have = seq.cache.length // self.block_size
        try:
            present = store.prefix_blocks(usable)
            if present <= have:
                return 0
            blocks = [self._decode_block(data) for data in store.get(usable[have:present])]
        except (grpc.RpcError, SpeckvError) as exc:
            log.info("%s: prefix read from %s failed (%s); recomputing", seq.job.request_id, where, exc)
            return 0
        seq.cache.import_blocks(blocks, self.block_size)
        return len(blocks)

    def _decode_block(self, data: bytes) -> np.ndarray:
        g = self.geometry
        if len(data) != g.bytes_per_block:
            raise InvalidArgument(f"block of {len(data)} bytes; the model's geometry needs {g.bytes_per_block}")
        return np.frombuffer(data, dtype=g.storage_dtype).reshape(g.block_shape).copy()

    def _store_prompt_blocks(self, seq: _Sequence) -> None:
        """Writes the prompt's full blocks that this node's kvstore lacks."""
        first = seq.job.reused_blocks
        blocks = [StoredBlock(seq.hashes[i], seq.hashes[i - 1] if i else None,
                              seq.cache.export_block(i, self.block_size)) for i in range(first, len(seq.hashes))]
        try:
            self._store.put(blocks, seq.job.family)
        except (grpc.RpcError, SpeckvError) as exc:
            log.warning("%s: storing %d blocks on %s failed: %s", seq.job.request_id, len(blocks), self.node_id, exc)
            return
        seq.job.stored_blocks = len(blocks)


def build_torch_engines(kvstores: Mapping[str, grpc.Channel], spec: ModelSpec, block_size: int,
                        limits: TorchLimits = TorchLimits(), time_scale: float = 1.0) -> dict[str, TorchEngine]:
    """One engine per node, sharing one model (same weights; calls are
    serialized by the driver), each writing to its own kvstore and able to
    pull from every other node's."""
    model = TinyGPT(spec)
    stores = {node: GrpcBlockStore(channel) for node, channel in kvstores.items()}
    return {node: TorchEngine(node, model, store, block_size, limits,
                              peers={n: s for n, s in stores.items() if n != node}, time_scale=time_scale)
            for node, store in stores.items()}


class TorchJobs:
    """The router's job factory for TorchEngines (see router.JobFactory):
    prompt token ids from the request's block ids (torch_kv.trace_tokens, the
    tail seeded by the request id), block ids = the trace's, so requests
    sharing an id prefix share tokens, KV and kvstore blocks. Requests must
    already be in model tokens (torch_kv.model_scale with this block_size)."""

    owns_kv = True

    def __init__(self, spec: ModelSpec, block_size: int) -> None:
        self._spec, self._block_size = spec, block_size

    def tokens(self, request_id: str, request: "TraceRequest") -> tuple[int, ...]:
        if request.block_tokens != self._block_size:
            raise InvalidArgument(f"request {request_id}: blocks of {request.block_tokens} tokens; the engine's are "
                                  f"{self._block_size} (scale the trace with torch_kv.model_scale)")
        tail_seed = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "little")
        return tuple(trace_tokens(request.block_hashes, request.prompt_tokens, self._block_size, self._block_size,
                                  self._spec.vocab_size, tail_seed))

    def make_job(self, request_id: str, request: "TraceRequest", output_tokens: int,
                 placement: "Placement") -> TorchJob:
        tokens = self.tokens(request_id, request)
        return TorchJob(request_id, len(tokens), output_tokens, tokens=tokens,
                        block_hashes=tuple(request.block_hashes[:request.full_blocks]), family=request.family,
                        fetch_from=placement.fetch_from if placement.fetched_tokens else "")

    def solo_prefill_ms(self, job: EngineJob) -> float:
        """From the start of its first prefill step to its first token: what
        is not queueing (its chunks may share steps with other work)."""
        if not isinstance(job, TorchJob) or job.prefill_start_s is None or job.first_token_s is None:
            return 0.0
        return (job.first_token_s - job.prefill_start_s) * 1e3
