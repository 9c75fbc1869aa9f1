"""vLLM KV events as speckv index events: the wire format, its mapping onto
the block index, and the sequence rules of one publisher. Pure: no zmq, no I/O.

Wire format (vllm/distributed/kv_events.py, ZmqEventPublisher): every batch is
one multipart message of three frames: topic, the batch's sequence number (8
bytes, big-endian, counting from 0 in each publisher process) and a msgpack
`EventBatch` {ts, events, data_parallel_rank?}. Events are `BlockStored`
(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, then
newer optional fields), `BlockRemoved` (block_hashes, medium, group_idx?) and
`AllBlocksCleared`. Releases encode these msgspec structs either as positional
arrays (array_like: the tag is the first element) or as maps tagged by a
"type" key; both are read, and missing trailing optional fields (older
releases lack `medium`) take their defaults (medium None = the device tier).
Fields after the ones named here (newer releases) are ignored.

Mapping (invariants the index relies on):
- Block hashes become speckv's uint64 block hashes (under the engine's layout
  digest, when the decoder is given one, they are then mapped to the ids the
  connector names the same blocks by: services/common/vllm_block_ids.py): an int is taken modulo
  2**64 (older releases publish signed 64-bit ints), bytes as the low 64 bits
  of their big-endian value, which is exactly what vLLM itself publishes when
  VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on, so one block has one id whichever
  way its engine is configured. vLLM chains its hashes (each block's hash
  covers its parent's), so the ids are already chained as Route expects.
- BlockStored -> STORED (has_parent = parent_block_hash is not None, so a chain
  root teaches the index its family, keyed by the first hash as Route's default
  family is); BlockRemoved -> REMOVED; AllBlocksCleared -> SNAPSHOT of nothing
  (the node's whole inventory is dropped, as vLLM's prefix cache was).
- block_size must equal the scheduler's: an event of another size is refused
  (Skip.BLOCK_SIZE), never converted: a coarser speckv block would need the
  position of every vLLM block in its chain, which the events do not carry.
- Only KV cache group 0 is indexed (group_idx absent, None or 0): in hybrid
  models the other groups (sliding window, mamba) drop blocks that group 0
  keeps, and a removal there must not unindex the prefix.
Bad input never raises past this module's callers except as BadInput: a batch
that is not a msgpack EventBatch is refused whole; a bad event inside a good
batch is skipped and counted, and the rest of the batch stands.
"""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.tiers import Tier
from speckv.services.common.vllm_block_ids import speckv_block_id
from speckv.services.common.vllm_wire import BATCH_FIELDS, EVENT_FIELDS, SEQUENCE_BYTES, TAG_FIELD, UINT64_MASK
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent


class Skip(enum.Enum):
    """Why input was not applied (the metric's `reason` attribute)."""

    BAD_FRAMES = "bad_frames"  # not (topic, 8-byte sequence, payload)
    GARBAGE = "garbage"  # payload is not a msgpack EventBatch
    UNKNOWN_TAG = "unknown_tag"  # an event type this scheduler does not know
    BAD_EVENT = "bad_event"  # a known event with missing fields or wrong types
    BLOCK_SIZE = "block_size"  # block_size differs from the scheduler's
    UNKNOWN_MEDIUM = "unknown_medium"  # a medium that is neither GPU nor CPU
    KV_GROUP = "kv_group"  # a KV cache group other than 0 (hybrid models)
    ENGINE_DEAD = "engine_dead"  # a batch that arrived while the engine's health probe said it was dead


class BadInput(ValueError):
    """Input refused whole; `reason` is what gets counted."""

    def __init__(self, reason: Skip, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(slots=True)
class DecodedBatch:
    """One EventBatch as index events, in publication order. `skipped` counts
    the events left out by reason; `details` keeps the first detail of each
    reason for the log."""

    sequence: int
    ts: float
    data_parallel_rank: int | None
    events: list[IndexEvent] = field(default_factory=list)
    skipped: Counter[Skip] = field(default_factory=Counter)
    details: dict[Skip, str] = field(default_factory=dict)

    def skip(self, reason: Skip, detail: str) -> None:
        self.skipped[reason] += 1
        self.details.setdefault(reason, detail)


def normalise_hash(value: object) -> int:
    """vLLM's block hash (int of any sign, or bytes) as a speckv uint64."""
    if isinstance(value, bool):  # bool is an int subclass; never a hash
        raise TypeError("a bool is not a block hash")
    if isinstance(value, int):
        return value & UINT64_MASK
    if isinstance(value, (bytes, bytearray)) and value:
        return int.from_bytes(value[-SEQUENCE_BYTES:], "big")
    raise TypeError(f"block hash {value!r:.40}: expected an int or non-empty bytes")


def split_frames(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """(sequence, payload) of one published message (topic, seq, payload)."""
    if len(frames) != 3 or len(frames[1]) != SEQUENCE_BYTES:
        raise BadInput(Skip.BAD_FRAMES, f"{len(frames)} frames, expected topic, 8-byte sequence, payload")
    return int.from_bytes(frames[1], "big"), bytes(frames[2])


def split_replay_frames(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """(sequence, payload) of one replayed batch as a DEALER receives it:
    (empty delimiter, seq, payload) from older vLLM releases and speckv's
    kvstore, (empty delimiter, topic, seq, payload) from vLLM 0.32, whose
    `_service_replay` sends the topic too (its end marker's topic is empty);
    None for the end marker (sequence -1, empty payload)."""
    if len(frames) not in (3, 4) or frames[0] != b"" or len(frames[-2]) != SEQUENCE_BYTES:
        raise BadInput(Skip.BAD_FRAMES, f"replay reply of {len(frames)} frames, expected '', [topic,] sequence, "
                                        "payload")
    sequence = int.from_bytes(frames[-2], "big", signed=True)
    if sequence < 0 or not frames[-1]:
        return None
    return sequence, bytes(frames[-1])


def replay_request(start: int) -> list[bytes]:
    """The frames a DEALER sends to ask vLLM's ROUTER for batches >= start."""
    return [b"", start.to_bytes(SEQUENCE_BYTES, "big")]


@dataclass(slots=True)
class VllmBatchDecoder:
    """Decodes EventBatch payloads for a scheduler whose blocks hold
    `block_size` tokens. Stateless apart from its settings: safe to share.
    digest: the engine's layout digest (32 bytes) when its blocks are to be
    indexed under speckv's ids (vllm_block_ids.py: the connector's names,
    which routers send); None: under vLLM's event ids as they come."""

    block_size: int
    digest: bytes | None = None

    def decode(self, sequence: int, payload: bytes) -> DecodedBatch:
        try:
            raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises many types (ExtraData, FormatError, StackError, ValueError...)
            raise BadInput(Skip.GARBAGE, f"not msgpack ({type(exc).__name__})") from None
        fields = _named(raw, BATCH_FIELDS)
        if fields is None:
            raise BadInput(Skip.GARBAGE, f"not an EventBatch (a {type(raw).__name__})")
        ts, events, rank = fields.get("ts"), fields.get("events"), fields.get("data_parallel_rank")
        if not _is_number(ts) or not isinstance(events, list) or not (rank is None or _is_int(rank)):
            raise BadInput(Skip.GARBAGE, "EventBatch wants ts: float, events: list, data_parallel_rank: int | None")
        batch = DecodedBatch(sequence, float(ts), rank)  # type: ignore[arg-type]
        for raw_event in events:
            self._decode_event(raw_event, batch)
        return batch

    def _decode_event(self, raw: Any, batch: DecodedBatch) -> None:
        tag, fields = _tagged(raw)
        if tag is None or fields is None:
            batch.skip(Skip.BAD_EVENT if tag is None else Skip.UNKNOWN_TAG, f"event {_short(raw)}")
            return
        if tag == "AllBlocksCleared":
            batch.events.append(IndexEvent(HolderEventKind.SNAPSHOT, [], sequence=batch.sequence))
            return
        group = fields.get("group_idx")
        if group is not None and group != 0:
            batch.skip(Skip.KV_GROUP, f"{tag} of KV cache group {_short(group)}")
            return
        size: object = None
        parent: object = None
        try:
            hashes = [normalise_hash(h) for h in _list(fields.get("block_hashes"), "block_hashes")]
            if self.digest is not None:
                hashes = [speckv_block_id(self.digest, h) for h in hashes]
            tier = _tier(fields.get("medium"))
            if tag == "BlockStored":
                size = fields.get("block_size")
                if not _is_int(size):
                    raise TypeError(f"block_size {_short(size)}: expected an int")
                parent = fields.get("parent_block_hash")
                if parent is not None:
                    normalise_hash(parent)
        except InvalidArgument as exc:
            batch.skip(Skip.UNKNOWN_MEDIUM, f"{tag}: {exc}")
            return
        except TypeError as exc:
            batch.skip(Skip.BAD_EVENT, f"{tag}: {exc}")
            return
        if not hashes:
            return  # nothing stored or removed: not an error
        if tag == "BlockRemoved":
            batch.events.append(IndexEvent(HolderEventKind.REMOVED, hashes, sequence=batch.sequence, tier=tier))
            return
        if size != self.block_size:
            batch.skip(Skip.BLOCK_SIZE, f"BlockStored of {size}-token blocks; the scheduler's blocks "
                                        f"hold {self.block_size} tokens (vLLM --block-size must match)")
            return
        batch.events.append(IndexEvent(HolderEventKind.STORED, hashes, has_parent=parent is not None,
                                       sequence=batch.sequence, tier=tier))


def _tagged(raw: Any) -> tuple[str | None, dict[str, Any] | None]:
    """(tag, fields) of one event in either encoding; (None, None) when it is
    not a tagged struct at all, (tag, None) when its tag is unknown."""
    if isinstance(raw, (list, tuple)):
        if not raw or not isinstance(raw[0], str):
            return None, None
        names = EVENT_FIELDS.get(raw[0])
        return (raw[0], dict(zip(names, raw[1:]))) if names is not None else (raw[0], None)
    if isinstance(raw, dict):
        tag = raw.get(TAG_FIELD)
        if not isinstance(tag, str):
            return None, None
        return (tag, raw) if tag in EVENT_FIELDS else (tag, None)
    return None, None


def _named(raw: Any, names: tuple[str, ...]) -> dict[str, Any] | None:
    """A struct's fields by name, from an array (positional) or a map."""
    if isinstance(raw, (list, tuple)):
        return dict(zip(names, raw)) if len(raw) >= 2 else None
    if isinstance(raw, dict):
        return raw
    return None


def _tier(medium: object) -> Tier:
    if medium is None:
        return Tier.DEVICE  # releases before tiers, or a GPU block: None means GPU
    if not isinstance(medium, str):
        raise TypeError(f"medium {_short(medium)}: expected a string or None")
    return Tier.parse(medium)


def _list(value: object, name: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} {_short(value)}: expected a list")
    return list(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- sequences ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CatchUp:
    """What to do before applying one batch.

    reset: drop the node's inventory first (nothing is known about what was
    missed: a fresh subscription, or a publisher that restarted).
    replay_from: ask the replay socket for [replay_from, sequence) first;
    None when nothing was missed."""

    reset: bool
    replay_from: int | None
    why: str


@dataclass(slots=True)
class SequenceTracker:
    """The sequence rules of one publisher, as seen by one subscriber.

    Invariant: `expected` is the sequence after the last batch applied since
    the connection came up, or None before the first one. vLLM's PUB socket
    delivers in order without duplicates, so a sequence below `expected` can
    only come from a new publisher process (sequences restart at 0)."""

    expected: int | None = None

    def plan(self, sequence: int) -> CatchUp:
        if self.expected is None:
            return CatchUp(True, 0 if sequence else None, "fresh subscription")
        if sequence == self.expected:
            return CatchUp(False, None, "")
        if sequence > self.expected:
            return CatchUp(False, self.expected, f"gap: missed {self.expected}..{sequence - 1}")
        return CatchUp(True, 0 if sequence else None, f"sequence went back from {self.expected} to {sequence} "
                                               "(the engine restarted)")

    def applied(self, sequence: int) -> None:
        self.expected = sequence + 1

    def lost_connection(self) -> None:
        """After a disconnection the publisher may be a new process whose
        sequences already passed ours: start over as a fresh subscription."""
        self.expected = None


def contiguous_run(replayed: Sequence[tuple[int, bytes]], start: int, end: int) -> tuple[list[tuple[int, bytes]], bool]:
    """The replayed batches to apply before batch `end`: the longest run of
    consecutive sequences ending at end - 1 within [start, end), in order, and
    whether it covers all of [start, end) (the catch-up is complete). A run
    that does not reach back to start still holds only real, consecutive
    batches: applied after a reset it leaves the index a true subset."""
    by_sequence = {seq: payload for seq, payload in replayed if start <= seq < end}
    run: list[tuple[int, bytes]] = []
    seq = end - 1
    while seq >= start and seq in by_sequence:
        run.append((seq, by_sequence[seq]))
        seq -= 1
    run.reverse()
    return run, seq < start
