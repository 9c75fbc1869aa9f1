"""How one load fills the engine's pages, in three stages, so that a caller
can copy it whole (a load before the forward, a background load) or layer
by layer beside the forward (layer_loads.py):

- ready: the kvstore call that puts the bytes at hand. Same host: MapBlocks
  pins the blocks (or the scheduler's lookup already did: the spec's lease)
  and names their pool pages. gRPC: GetBlocks, crc32c checked by the port.
  A pull (LoadSpec.source, a peer's node id): that peer's kvstore copies the
  blocks into this node's (Replicate), then they are readied from it.
- copy_layer: one layer's bytes into the spec's pages (pages.py), from the
  pinned pool pages or straight from the received bytes.
- end: the checks after the last layer and the release of the pins (queued
  to the sender thread); a copy that ended past its pin lease fails (the
  kvstore may have reused the pages under it).

Every failure is an answer (None / False, counted, one log line), never an
exception, so the engine recomputes the blocks (fail open).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.pages import (
    Pages, cuda_settle, item_size, pool_to_pages_layer, raw, scatter_blocks)
from speckv.services.engine.vllm_connector.plan import LoadSpec
from speckv.services.engine.vllm_connector.port import (
    KVStorePort, MappedPoolSet, PeerPort, PullTarget, ReadLease, SharedPort)
from speckv.services.kvstore.shm.runs import Run, paired_runs

log = logging.getLogger("speckv.vllm_connector")
RESOLVE_RETRY_S = 10.0  # how often a node id the kvstore could not say is asked again


@dataclass(slots=True)
class ReadyLoad:
    """A load whose bytes are at hand. path: "shm", "grpc" or "pull".
    Exactly one of pools (pinned pool pages: per pool, its array and the
    runs from its pages to the engine's) and blocks (received canonical
    blocks, one array per page) is set."""

    spec: LoadSpec
    path: str
    started: float  # time.perf_counter() when the load began
    pools: list[tuple[np.ndarray, list[Run]]] = field(default_factory=list)
    blocks: list[np.ndarray] = field(default_factory=list)
    lease: ReadLease | None = None  # the pins the copy reads under: it must end before lease.until
    release: Callable[[], None] | None = None  # ends the pins, after the last layer
    copy_seconds: float = 0.0


class PageLoader:
    """The stages of a load into the pages registered in `pages` (each
    layer's [blocks, 2, N, H, C] as pages.page_arrays gives them: NumPy
    arrays of CPU pages or torch tensors of CUDA pages)."""

    def __init__(self, client: KVStorePort, counters: Counters, submit: Callable[[Callable[[], object]], None],
                 shared: SharedPort | None = None, peers: Mapping[str, PeerPort] | None = None,
                 pull_target: PullTarget | Callable[[], PullTarget | None] | None = None) -> None:
        """submit: runs a call on the worker's sender thread (releases go there, off the step);
        pull_target: this node as pulls name it, or how to find it out (asked again at most every
        RESOLVE_RETRY_S until it answers: the kvstore may start after the engine)."""
        self._client = client
        self._counters = counters
        self._submit = submit
        self._shared = shared
        self._peers = dict(peers or {})
        self._pull_target = pull_target if isinstance(pull_target, PullTarget) else None
        self._resolve = None if pull_target is None or isinstance(pull_target, PullTarget) else pull_target
        self._resolve_after = 0.0  # time.monotonic() before which the target is not asked again
        self._pulls = 0  # order ids of this worker's pulls
        self.pages: list[Pages] = []
        self.block_shape: tuple[int, ...] = ()  # canonical [layers, 2, N, H, C] of one block
        self.block_bytes = 0

    def load(self, spec: LoadSpec) -> bool:
        """The whole load now, every layer; whether it succeeded."""
        ready = self.ready(spec)
        if ready is None:
            return False
        copied = False
        try:
            for layer in range(len(self.pages)):
                self.copy_layer(ready, layer)
            copied = True
        except Exception:  # noqa: BLE001 - a load fails open: its blocks are recomputed, the pins still released
            log.exception("speckv: a copy into the engine's pages failed; the engine recomputes its blocks")
        return self.end(ready, copied)

    def ready(self, spec: LoadSpec) -> ReadyLoad | None:
        """The bytes at hand; None when they cannot be (a pin or lease is released then)."""
        started = time.perf_counter()
        if not self.pages:
            if spec.lease is not None:
                self._submit(lambda lease=spec.lease: self._client.release(lease))
            return None
        if spec.source:
            ready = self._pull(spec, started)
            if ready is None:
                self._counters.add(pull_failures=1)
            return ready
        if spec.lease is not None:
            return self._leased(spec, spec.lease, started)
        return self._shared_or_grpc(spec, started)

    def copy_layer(self, ready: ReadyLoad, layer: int) -> None:
        copying = time.perf_counter()
        for pool, runs in ready.pools:
            pool_to_pages_layer(self.pages[layer], pool, layer, runs)
        if ready.blocks:
            scatter_blocks([self.pages[layer]], ready.spec.page_ids, [block[layer:layer + 1] for block in ready.blocks])
        # Device copies complete before the layer counts as written: the forward may read it from another thread.
        cuda_settle(self.pages)
        ready.copy_seconds += time.perf_counter() - copying

    def end(self, ready: ReadyLoad, copied: bool = True) -> bool:
        """After the last layer (copied: every layer was): the pins released
        and the load counted; whether it succeeded."""
        if ready.release is not None:
            self._submit(ready.release)
        spec, count = ready.spec, len(ready.spec.block_ids)
        self._counters.add(load_copy_seconds=ready.copy_seconds)
        if not copied:
            self._counters.add(load_failures=1)
            return False
        if ready.lease is not None and time.monotonic() > ready.lease.until:
            self._counters.add(load_failures=1)
            log.warning("speckv: a load of %d blocks outlasted its pin lease; the engine recomputes them", count)
            return False
        self._counters.add(blocks_loaded=count,
                           blocks_loaded_shared=count if ready.path == "shm" else 0,
                           bytes_loaded=count * self.block_bytes, load_seconds=time.perf_counter() - ready.started)
        return True

    def _shared_or_grpc(self, spec: LoadSpec, started: float) -> ReadyLoad | None:
        shared = self._shared
        if shared is None:
            return self._grpc(spec, started)
        lease = shared.map_for_read(spec.block_ids)
        if lease is None:
            return None
        pools = shared.pools_for(lease)
        if pools is None:  # the kvstore restarted between the pin and here
            self._submit(lambda: shared.release(lease))
            return None
        return self._pinned(spec, lease, 0, started, lambda: shared.release(lease), pools)

    def _leased(self, spec: LoadSpec, lease: ReadLease, started: float) -> ReadyLoad | None:
        """Blocks the scheduler's lookup pinned: read from the pinned pages
        when they are in the pools mapped here, else over gRPC; the lease is
        released after either."""
        def release() -> None:
            self._client.release(lease)
        count = len(spec.block_ids)
        if lease.ids[spec.lease_start:spec.lease_start + count] != spec.block_ids:
            log.warning("speckv: a load's blocks are not its lookup's; loading them over gRPC")
        elif time.monotonic() > lease.until:
            # Its pins lapsed while it waited (a queued background load): the pages may hold other blocks
            # by now, so read the blocks, checked, over gRPC rather than copy and then refuse the copy.
            log.info("speckv: a load's pins lapsed before it ran; loading its %d blocks over gRPC", count)
        elif self._shared is not None and (pools := self._shared.pools_for(lease)) is not None:
            return self._pinned(spec, lease, spec.lease_start, started, release, pools)
        ready = self._grpc(spec, started)
        if ready is None:
            self._submit(release)
            return None
        ready.release = release
        return ready

    def _pinned(self, spec: LoadSpec, lease: ReadLease, start: int, started: float,
                release: Callable[[], None], mapped: MappedPoolSet) -> ReadyLoad:
        """mapped: the one pools object the lease was checked against, read
        even if another thread maps the pools again meanwhile (a restart)."""
        pools = [(raw(mapped.pool(medium)), paired_runs(pool_pages, [spec.page_ids[i] for i in positions]))
                 for medium, (positions, pool_pages) in lease.by_medium(start, len(spec.block_ids)).items()]
        return ReadyLoad(spec, "shm", started, pools=pools, lease=lease, release=release)

    def _grpc(self, spec: LoadSpec, started: float) -> ReadyLoad | None:
        data = self._client.get(spec.block_ids)
        if data is None:
            return None
        if any(len(block) != self.block_bytes for block in data):
            self._counters.add(load_failures=1)
            log.warning("speckv kvstore: blocks of %s bytes, this engine's are %d; the engine recomputes them",
                        sorted({len(block) for block in data}), self.block_bytes)
            return None
        dtype = np.dtype(f"u{item_size(self.pages[0])}")
        # Views of the received bytes: the copies read them straight into the pages, no staging.
        blocks = [np.frombuffer(block, dtype=dtype).reshape(self.block_shape) for block in data]
        return ReadyLoad(spec, "grpc", started, blocks=blocks)

    def _target(self) -> PullTarget | None:
        if self._pull_target is None and self._resolve is not None and time.monotonic() >= self._resolve_after:
            self._resolve_after = time.monotonic() + RESOLVE_RETRY_S
            self._pull_target = self._resolve()
        return self._pull_target

    def _pull(self, spec: LoadSpec, started: float) -> ReadyLoad | None:
        """The peer copies the blocks into this node's kvstore; then they are readied from it."""
        peer, target = self._peers.get(spec.source), self._target()
        if peer is None or target is None:  # the scheduler side plans pulls only from known peers
            log.warning("speckv: a pull from %r that this worker cannot make (peer known: %s, own node known: "
                        "%s); the engine recomputes", spec.source, peer is not None, target is not None)
            return None
        self._pulls += 1
        order_id = f"pull-{target.node_id}-{spec.req_id}-{self._pulls}"
        copied = peer.replicate_to(target.node_id, target.address, spec.block_ids, spec.family, order_id)
        if copied is None:
            return None
        self._counters.add(blocks_pulled=copied)  # those this node held already are loaded, not copied
        ready = self._shared_or_grpc(spec, started)
        if ready is not None:
            ready.path = "pull"
        return ready
