"""A kvstore's KV events in vLLM's wire format (events out): the mapping onto
vLLM's event structs, their msgpack encoding and the publisher's frames.
Pure: no zmq, no I/O (the sockets are vllm_publisher.py). The names and field
orders are services/common/vllm_wire.py's, shared with the scheduler's
decoder (scheduler/adapters/vllm_decode.py), which reads back everything written here.

Mapping, one KVEvent to one EventBatch (invariants):
- STORED and COMMITTED -> BlockStored(block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name): the event's run of
  chained blocks, head first, and the hash before it (None: the run starts a
  chain), as vLLM's BlockStored. `token_ids` is always empty: a kvstore keys
  KV bytes by block hash and never sees the tokens, so a consumer that
  re-hashes token ids cannot index these blocks; one that keys by the
  published hashes can. lora_id and lora_name are None.
- REMOVED -> BlockRemoved(block_hashes, medium).
- SNAPSHOT (a reader that fell behind the log's retention) -> AllBlocksCleared,
  then one single-block BlockStored per resident block, parent None, the
  device tier's ("GPU") before the host tier's ("CPU"). A snapshot lists
  blocks, not chains: several hashes in one BlockStored would claim they
  chain, and a chain-building consumer could then match a prefix the node
  does not hold. One block per event claims only that the block is here, so
  such a consumer under-counts a prefix until its blocks are stored again.
- medium is the event's tier as vLLM names it ("GPU", "CPU"). Hashes are
  speckv's uint64s as unsigned msgpack ints: the form vLLM publishes with
  VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, which the scheduler keeps unchanged.
- Nothing else crosses: family, order_id and node_id have no vLLM field (a
  consumer keys the node by the endpoint it subscribes to). The batch's ts is
  the event's node-clock time; its data_parallel_rank is 0 (a kvstore is one
  rank).

Encodings (Encoding): the EventBatch is a positional array [ts, events,
data_parallel_rank] in both, as in every vLLM release. TAGGED writes each
event as a map with its tag under "type" (msgspec's tagged structs without
array_like): vLLM's encoding since vllm-project/vllm#42892 (v0.26.0 publishes
it), and the one that survives schema additions. ARRAY_LIKE writes each event
as a positional array, tag first: releases before that change (v0.23.x and
earlier), for consumers not yet updated. Either way only the fields vLLM
always writes are written (its fields without defaults, under omit_defaults);
the optional ones after them (extra_keys, group_idx, ...) are left out, as
vLLM leaves them out when they are None: readers take them as absent (no
extra keys; KV cache group 0).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence, Union

import msgpack

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.tiers import Tier
from speckv.services.common.vllm_wire import (
    ALL_BLOCKS_CLEARED,
    BLOCK_REMOVED,
    BLOCK_STORED,
    EVENT_FIELDS,
    REPLAY_END,
    SEQUENCE_BYTES,
    TAG_FIELD,
)
from speckv.services.kvstore.events import EventType, KVEvent

DATA_PARALLEL_RANK = 0


class Encoding(enum.Enum):
    TAGGED = "tagged"
    ARRAY_LIKE = "array_like"

    @staticmethod
    def parse(name: str, field_name: str = "encoding") -> "Encoding":
        try:
            return Encoding(name.strip().lower())
        except ValueError:
            raise InvalidArgument(f"{field_name}={name!r}: expected one of "
                                  f"{', '.join(e.value for e in Encoding)}") from None


# --- vLLM's event structs, as speckv writes them -------------------------------
# Each field is named as vLLM names it, so the wire order comes from
# EVENT_FIELDS alone; `written` is how many of those fields vLLM always writes.

@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    block_size: int
    medium: str
    token_ids: tuple[int, ...] = ()  # speckv keeps no token ids (see the module's docstring)
    lora_id: int | None = None
    lora_name: str | None = None

    tag: ClassVar[str] = BLOCK_STORED
    written: ClassVar[int] = 7  # block_hashes .. lora_name


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str

    tag: ClassVar[str] = BLOCK_REMOVED
    written: ClassVar[int] = 2


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    tag: ClassVar[str] = ALL_BLOCKS_CLEARED
    written: ClassVar[int] = 0


VllmEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


def to_vllm_events(event: KVEvent) -> list[VllmEvent]:
    """The vLLM events of one kvstore event, in the order they apply."""
    if event.type in (EventType.STORED, EventType.COMMITTED):
        return [BlockStored(tuple(event.block_hashes), event.parent, event.block_size, event.medium)]
    if event.type is EventType.REMOVED:
        return [BlockRemoved(tuple(event.block_hashes), event.medium)]
    if event.type is EventType.SNAPSHOT:
        tiers = ((Tier.DEVICE, event.block_hashes), (Tier.HOST, event.host_block_hashes),
                 (Tier.DISK, event.disk_block_hashes))
        return [AllBlocksCleared(), *(BlockStored((h,), None, event.block_size, tier.medium)
                                      for tier, hashes in tiers for h in hashes)]
    raise ValueError(f"KV event type {event.type!r} has no vLLM form")


def event_to_wire(event: VllmEvent, encoding: Encoding) -> dict[str, Any] | list[Any]:
    """One event as msgpack will write it (a map or an array)."""
    names = EVENT_FIELDS[event.tag][:event.written]
    values = [_plain(getattr(event, name)) for name in names]
    if encoding is Encoding.TAGGED:
        return {TAG_FIELD: event.tag, **dict(zip(names, values))}
    return [event.tag, *values]


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def encode_batch(ts: float, events: Sequence[VllmEvent], encoding: Encoding,
                 data_parallel_rank: int = DATA_PARALLEL_RANK) -> bytes:
    """An EventBatch payload: msgpack of [ts, events, data_parallel_rank]."""
    return msgpack.packb([float(ts), [event_to_wire(e, encoding) for e in events], data_parallel_rank],
                         use_bin_type=True)


def encode_event(event: KVEvent, encoding: Encoding) -> bytes:
    """The EventBatch payload of one kvstore event."""
    return encode_batch(event.time_s, to_vllm_events(event), encoding)


# --- frames --------------------------------------------------------------------

def publish_frames(topic: bytes, sequence: int, payload: bytes) -> list[bytes]:
    """One published batch: topic, 8-byte big-endian sequence, payload."""
    return [topic, sequence.to_bytes(SEQUENCE_BYTES, "big"), payload]


def parse_replay_request(frames: Sequence[bytes]) -> tuple[bytes, int] | None:
    """(client identity, start sequence) of a request as a ROUTER receives it
    (identity, empty delimiter, 8-byte big-endian start; what a REQ or a
    DEALER sending ['', start] produces); None when it is not one."""
    if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != SEQUENCE_BYTES:
        return None
    return bytes(frames[0]), int.from_bytes(frames[2], "big")


def replay_frames(client: bytes, sequence: int, payload: bytes) -> list[bytes]:
    """One replayed batch to client: the client receives ('', sequence, payload)."""
    return [client, b"", sequence.to_bytes(SEQUENCE_BYTES, "big"), payload]


def replay_end_frames(client: bytes) -> list[bytes]:
    """The end of a replay: the client receives ('', -1, b'')."""
    return [client, b"", REPLAY_END.to_bytes(SEQUENCE_BYTES, "big", signed=True), b""]
