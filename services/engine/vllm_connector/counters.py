"""What a connector did, counted: the fail-open paths show here (and in one
log line each), never as a failed request. Pure: no vLLM, no gRPC."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class Counters:
    """What one connector did. Blocks, calls, bytes and seconds; never reset."""

    lookups: int = 0  # of this node's kvstore
    lookup_failures: int = 0
    peer_lookups: int = 0  # of a peer's kvstore that a request names to pull from
    peer_lookup_failures: int = 0
    blocks_matched: int = 0  # offered to the engine past its own prefix-cache hit
    blocks_loaded: int = 0
    blocks_loaded_shared: int = 0  # of blocks_loaded, those copied from the kvstore's mapped pool
    load_failures: int = 0  # failed GetBlocks calls or blocks (each costs a recompute)
    blocks_pulled: int = 0  # copied here from a peer's kvstore by pulls (kv_transfer_params' pull_from); not those held here already
    pull_failures: int = 0  # pulls whose peer load failed (a recompute)
    pulls_refused: int = 0  # requests naming a peer the connector does not know
    async_load_failures: int = 0  # requests whose background load failed (recomputed from their start)
    blocks_saved: int = 0  # newly stored by the kvstore
    blocks_saved_shared: int = 0  # of blocks_saved, those written into the kvstore's mapped pool
    blocks_already_present: int = 0
    save_failures: int = 0
    shared_remaps: int = 0  # the kvstore's shared pools changed under the connector (a restart): mapped again
    load_seconds: float = 0.0  # wall time of the worker's loads (the kvstore call, checks, copy into the pages)
    bytes_loaded: int = 0
    load_copy_seconds: float = 0.0  # of load_seconds, the copies into the pages (from the mapped pool or received bytes)
    save_seconds: float = 0.0  # wall time the worker's saves held the engine's step (wait_for_save): copies, Reserve
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        with self.lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "lock"}


ALL_COUNTERS: list[Counters] = []  # every connector's counters in this process (tests, benches)
