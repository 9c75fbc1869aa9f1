"""vLLM's KV event wire format: the names and field orders that both
directions share, defined once. The scheduler's decoder
(scheduler/adapters/vllm_decode.py, events in) and the kvstore's encoder
(kvstore/vllm_encode.py, events out) import them, so the two cannot drift.

Source: vllm/distributed/kv_events.py (msgspec structs `EventBatch`,
`BlockStored`, `BlockRemoved`, `AllBlocksCleared`; `ZmqEventPublisher`).
Constants only: no I/O, no msgpack, no zmq.
"""
from __future__ import annotations

UINT64_MASK = (1 << 64) - 1
SEQUENCE_BYTES = 8  # every sequence number on the wire: 8 bytes, big-endian
REPLAY_END = -1  # the replay socket's end marker: this sequence (signed), then an empty payload
TAG_FIELD = "type"  # msgspec's default tag field for tagged structs encoded as maps

BLOCK_STORED = "BlockStored"
BLOCK_REMOVED = "BlockRemoved"
ALL_BLOCKS_CLEARED = "AllBlocksCleared"

# Field order of each event struct after its tag (the positions of the
# array_like encoding; the keys of the map encoding). Newer releases append
# optional fields; a reader ignores the ones it does not name.
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    BLOCK_STORED: ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                   "lora_name", "extra_keys", "group_idx"),
    BLOCK_REMOVED: ("block_hashes", "medium", "group_idx"),
    ALL_BLOCKS_CLEARED: (),
}
BATCH_FIELDS = ("ts", "events", "data_parallel_rank")
