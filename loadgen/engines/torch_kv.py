"""Block ids and block I/O of the torch engine: chained content hashes from
token ids, token ids for trace requests, and the small store interface the
engine reads and writes KV blocks through (a kvstore over gRPC, or a
KVStoreCore in the same process).

Hash chain (vLLM prefix-caching style): hash_0 = H(salt, 0, tokens of block
0), hash_i = H(salt, hash_{i-1}, tokens of block i), H = BLAKE2b with an
8-byte digest masked to 63 bits (so ids fit a signed int64 too), tokens as
little-endian int32. The salt is the model's fingerprint: KV is a function
of the weights, so two models never share a block id. Only full blocks have
ids; a partial tail block is never stored.

Trace requests carry block ids (Mooncake hash_ids) and lengths, not tokens:
`trace_tokens` derives block i's tokens from hash_ids[i] alone, so requests
sharing an id prefix share a token prefix, and the engine may key blocks by
the trace's ids (a chained id names its whole prefix, as the chain does).
`model_scale` rewrites a trace request into the model's tokens first (one
model block per trace block), so that everything downstream of it, the
scheduler's routes included, counts the tokens the engine runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import grpc
import numpy as np

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import BlockHash
from speckv.services.common.traces import TraceRequest
from speckv.services.kvstore.records import BlockWrite
from speckv.services.kvstore.store import KVStoreCore
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc

HASH_MASK = (1 << 63) - 1


def chain_hashes(tokens: Sequence[int], block_size: int, salt: bytes = b"") -> list[BlockHash]:
    """Ids of the full blocks of `tokens` (len(tokens) // block_size of them)."""
    hashes: list[BlockHash] = []
    parent = 0
    for i in range(len(tokens) // block_size):
        digest = hashlib.blake2b(digest_size=8, key=salt[:64])
        digest.update(parent.to_bytes(8, "little"))
        digest.update(np.asarray(tokens[i * block_size:(i + 1) * block_size], dtype="<i4").tobytes())
        parent = int.from_bytes(digest.digest(), "little") & HASH_MASK
        hashes.append(BlockHash(parent))
    return hashes


def trace_tokens(block_hashes: Sequence[int], prompt_tokens: int, trace_block_tokens: int, block_size: int,
                 vocab_size: int, tail_seed: int = 0) -> list[int]:
    """Model tokens for a trace request, scaled down: each of the request's
    full trace blocks (trace_block_tokens tokens) becomes one model block of
    block_size tokens drawn from a generator seeded by its id; the partial
    tail becomes ceil(tail / scale) tokens seeded by `tail_seed` (per request).
    Always at least one token."""
    full = min(len(block_hashes), prompt_tokens // trace_block_tokens)
    tokens: list[int] = []
    for block_hash in block_hashes[:full]:
        rng = np.random.default_rng(int(block_hash))
        tokens.extend(rng.integers(0, vocab_size, block_size).tolist())
    tail = prompt_tokens - full * trace_block_tokens
    tail_len = -(-tail * block_size // trace_block_tokens) if tail > 0 else (0 if tokens else 1)
    tokens.extend(np.random.default_rng([tail_seed, 1]).integers(0, vocab_size, tail_len).tolist())
    return tokens


def model_scale(request: TraceRequest, block_size: int, max_tokens: int) -> TraceRequest:
    """The request in model tokens: each full trace block becomes one block of
    block_size tokens (same id), the partial tail ceil(tail x scale) tokens
    but never a whole block (so full-block counts are kept), and the output
    ceil(output x scale) tokens, at least 1 (scale = block_size /
    request.block_tokens). Prompts whose prompt + output would exceed
    max_tokens (the model's positions) lose trailing full blocks (and their
    ids) until they fit. Arrival and family are kept; the result's
    block_tokens is block_size. Needs a trace with block ids."""
    if not request.block_tokens or block_size <= 0:
        raise InvalidArgument("model_scale: the request needs block_tokens and block_size must be > 0")
    full, unit = request.full_blocks, request.block_tokens
    tail = request.prompt_tokens - full * unit
    tail_tokens = min(block_size - 1, -(-tail * block_size // unit)) if tail > 0 else 0
    output = max(1, -(-request.output_tokens * block_size // unit))
    hashes = request.block_hashes
    if full * block_size + max(1, tail_tokens) + output > max_tokens:
        full = max(0, (max_tokens - output - max(1, tail_tokens)) // block_size)
        hashes = hashes[:full]
    prompt = max(1, full * block_size + tail_tokens)
    if prompt + output > max_tokens:
        raise InvalidArgument(f"model_scale: max_tokens={max_tokens} cannot hold {prompt} + {output} tokens")
    return dataclasses.replace(request, prompt_tokens=prompt, output_tokens=output, block_hashes=hashes,
                               block_tokens=block_size)


@dataclass(slots=True)
class StoredBlock:
    block_hash: BlockHash
    parent: BlockHash | None
    data: np.ndarray  # canonical layout, the pool's dtype


class BlockStore(Protocol):
    """What the engine needs from a node's kvstore."""

    def prefix_blocks(self, hashes: Sequence[BlockHash]) -> int:
        """Length of the longest run of present ids from the start."""
        ...

    def get(self, hashes: Sequence[BlockHash]) -> list[bytes]:
        """Canonical bytes of each id, in order (NotFound if one is gone)."""
        ...

    def put(self, blocks: Sequence[StoredBlock], family: str) -> None: ...


class GrpcBlockStore:
    """A kvstore reached over gRPC (Lookup, GetBlocks, PutBlocks)."""

    def __init__(self, channel: grpc.Channel, timeout_s: float = 30.0) -> None:
        self._stub = kvstore_pb2_grpc.KVStoreStub(channel)
        self._timeout_s = timeout_s

    def prefix_blocks(self, hashes: Sequence[BlockHash]) -> int:
        if not hashes:
            return 0
        reply = self._stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=list(hashes)), timeout=self._timeout_s)
        return reply.prefix_blocks

    def get(self, hashes: Sequence[BlockHash]) -> list[bytes]:
        if not hashes:
            return []
        stream = self._stub.GetBlocks(kvstore_pb2.GetBlocksRequest(block_hashes=list(hashes)), timeout=self._timeout_s)
        return [block.data for block in stream]

    def put(self, blocks: Sequence[StoredBlock], family: str) -> None:
        def messages() -> Iterator[kvstore_pb2.PutBlockRequest]:
            for block in blocks:
                yield kvstore_pb2.PutBlockRequest(
                    block_hash=block.block_hash, data=block.data.tobytes(), family=family,
                    parent_hash=block.parent or 0, has_parent=block.parent is not None)

        if blocks:
            self._stub.PutBlocks(messages(), timeout=self._timeout_s)


class CoreBlockStore:
    """A KVStoreCore in this process (the simulator, unit tests)."""

    def __init__(self, core: KVStoreCore) -> None:
        self._core = core

    def prefix_blocks(self, hashes: Sequence[BlockHash]) -> int:
        return self._core.lookup(list(hashes)).prefix_blocks if hashes else 0

    def get(self, hashes: Sequence[BlockHash]) -> list[bytes]:
        if not hashes:
            return []
        blocks = self._core.get_blocks(list(hashes))
        try:
            return [buffer.tobytes() for _, buffer in blocks]
        finally:
            blocks.close()

    def put(self, blocks: Sequence[StoredBlock], family: str) -> None:
        if blocks:
            self._core.put_blocks([BlockWrite(b.block_hash, b.data, family, b.parent) for b in blocks])
