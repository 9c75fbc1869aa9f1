"""The connector's worker half: fills the engine's pages from the kvstore
before a step's forward (start_load_kv) and saves the step's newly computed
full blocks after it (wait_for_save).

Two paths, chosen once when the connector starts: the same-host one when
the kvstore's pools are mapped here (a SharedPort, shared_client.py), else
gRPC. Loads are synchronous by default: all of a step's blocks are copied
into every layer's pages in start_load_kv, so wait_for_layer_load has
nothing to wait for. A load that fails reports its pages through
get_block_ids_with_load_errors in the same step; with
kv_load_failure_policy "recompute" vLLM then recomputes them. With
`load_async` the same loads run on a background thread instead
(background_loads.py) and end as finished (or failed) receives.

- Same host: MapBlocks pins the blocks and names their pool pages, one
  strided copy per layer and run moves them into the engine's pages
  (pages.pool_to_pages); Unpin follows on the sender thread. A save reserves
  pages (Reserve with shared_memory), copies the step's pages straight into
  them in wait_for_save (the engine may reuse its pages once the step ends)
  and leaves the checksums and Commit to the sender thread.
- gRPC: GetBlocks (crc32c checked) then a scatter; a save copies the pages
  into canonical blocks in wait_for_save and the sender thread PutBlocks them.
- A pull (LoadSpec.source, a peer's node id): that peer's kvstore is asked
  to copy the blocks into this node's (Replicate, over the kvstores' data
  plane), then they load from this node's kvstore as above.

The sender thread runs queued calls in order, so the step never waits on a
commit or a put; shutdown (or flush) drains it.
"""
from __future__ import annotations

import logging
import queue
import re
import threading
import time
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from speckv.services.engine.vllm_connector.background_loads import BackgroundLoads
from speckv.services.engine.vllm_connector.identity import KVLayout
from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.port import KVStorePort, PeerPort, PullTarget, ReadLease, SharedPort
from speckv.services.engine.vllm_connector.pages import (
    gather_blocks, page_arrays, page_views, pages_to_pool, pool_to_pages, raw, scatter_blocks)
from speckv.services.engine.vllm_connector.plan import LoadSpec, SaveSpec, StepPlan

log = logging.getLogger("speckv.vllm_connector")
LAYER_INDEX = re.compile(r"\.(\d+)\.")
MAX_QUEUED_SAVES = 64  # calls waiting for the sender; past that a save is dropped (counted)


def layer_order(names: Sequence[str]) -> list[str]:
    """Attention layer names in model order (by their first numeric part)."""
    def key(name: str) -> tuple[int, str]:
        match = LAYER_INDEX.search(name)
        return (int(match.group(1)) if match else -1, name)
    return sorted(names, key=key)


class WorkerSide:
    def __init__(self, layout: KVLayout, client: KVStorePort, counters: Counters,
                 shared: SharedPort | None = None, peers: Mapping[str, PeerPort] | None = None,
                 pull_target: PullTarget | None = None) -> None:
        """peers: the peers' kvstores by node id; pull_target: this node as
        pulls name it (None: pulls fail open)."""
        self._layout = layout
        self._client = client
        self._peers = dict(peers or {})
        self._pull_target = pull_target
        self._pulls = 0  # order ids of this worker's pulls
        self._shared = shared
        self._counters = counters
        self._pages: list[np.ndarray] = []  # each layer's pages [blocks, H, 2, N, C] as unsigned ints (pages.py)
        self._block_bytes = 0  # canonical bytes of one block, set by register_kv_caches
        self._load_errors: set[int] = set()
        self._queue: queue.Queue[Callable[[], object] | None] = queue.Queue(MAX_QUEUED_SAVES)
        self._sender = threading.Thread(target=self._send_loop, name="speckv-save", daemon=True)
        self._sender.start()
        self._background = BackgroundLoads(self._load_one)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = layer_order(list(kv_caches))
        if len(names) != self._layout.num_layers:
            raise ValueError(f"SpeckvConnector: {len(names)} KV cache layers, the layout says "
                             f"{self._layout.num_layers}")
        views = page_views([kv_caches[n] for n in names], self._layout.num_kv_heads, self._layout.block_size,
                           self._layout.head_dim)
        self._pages = page_arrays(views)
        one_page = self._pages[0][0]  # [heads, 2, block_size, head_dim] of one layer
        self._block_bytes = len(self._pages) * one_page.nbytes

    def _block_shape(self) -> tuple[int, ...]:
        layout = self._layout
        return (layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)

    @property
    def shared(self) -> bool:
        """Whether KV moves through the kvstore's mapped pools."""
        return self._shared is not None

    def load(self, plan: StepPlan) -> None:
        """The step's loads: plan.loads now (a failure reports its pages as
        load errors), plan.async_loads on the background thread."""
        for spec in plan.loads:
            if not self._load_one(spec):
                self._load_errors.update(spec.page_ids)
        if plan.async_loads:
            self._background.start(plan.async_loads)

    def _load_one(self, spec: LoadSpec) -> bool:
        """One load into the engine's pages, counted; whether it succeeded."""
        started = time.perf_counter()
        if not self._pages:
            if spec.lease is not None:
                self._submit(lambda lease=spec.lease: self._client.release(lease))
            return False
        if spec.source:
            path = self._pull(spec)
        elif spec.lease is not None:
            path = self._load_leased(spec, spec.lease)
        else:
            path = self._load_shared(spec) if self._shared is not None else self._load_grpc(spec)
        if path is None:
            if spec.source:
                self._counters.add(pull_failures=1)
            return False
        self._counters.add(blocks_loaded=len(spec.block_ids),
                           blocks_pulled=len(spec.block_ids) if path == "pull" else 0,
                           blocks_loaded_shared=len(spec.block_ids) if path == "shm" else 0,
                           bytes_loaded=len(spec.block_ids) * self._block_bytes,
                           load_seconds=time.perf_counter() - started)
        return True

    def take_finished_loads(self) -> tuple[set[str], set[str]]:
        """Requests whose background loads ended since the last call, and of those the failed."""
        return self._background.take_finished()

    def _load_grpc(self, spec: LoadSpec) -> str | None:
        data = self._client.get(spec.block_ids)
        if data is None:
            return None
        if any(len(block) != self._block_bytes for block in data):
            self._counters.add(load_failures=1)
            log.warning("speckv kvstore: blocks of %s bytes, this engine's are %d; the engine recomputes them",
                        sorted({len(block) for block in data}), self._block_bytes)
            return None
        dtype, shape = self._pages[0].dtype, self._block_shape()
        # Straight from the received bytes into the pages: no staging copy.
        scatter_blocks(self._pages, spec.page_ids, [np.frombuffer(block, dtype=dtype).reshape(shape) for block in data])
        return "grpc"

    def _pull(self, spec: LoadSpec) -> str | None:
        """The peer copies the blocks into this node's kvstore; then they load from it."""
        peer, target = self._peers.get(spec.source), self._pull_target
        if peer is None or target is None:  # the scheduler side plans pulls only from known peers
            log.warning("speckv: a pull from %r that this worker cannot make (peer known: %s, own node known: "
                        "%s); the engine recomputes", spec.source, peer is not None, target is not None)
            return None
        self._pulls += 1
        order_id = f"pull-{target.node_id}-{spec.req_id}-{self._pulls}"
        if not peer.replicate_to(target.node_id, target.address, spec.block_ids, spec.family, order_id):
            return None
        path = self._load_shared(spec) if self._shared is not None else self._load_grpc(spec)
        return "pull" if path is not None else None

    def _load_shared(self, spec: LoadSpec) -> str | None:
        shared = self._shared
        assert shared is not None
        lease = shared.map_for_read(spec.block_ids)
        if lease is None:
            return None
        try:
            return self._copy_leased(spec, lease, 0)
        finally:
            self._submit(lambda: shared.release(lease))

    def _load_leased(self, spec: LoadSpec, lease: ReadLease) -> str | None:
        """A load whose blocks the scheduler's lookup pinned: copied from the
        pinned pages when they are in the pools mapped here, else over gRPC;
        the lease is released after either."""
        try:
            count = len(spec.block_ids)
            if lease.ids[spec.lease_start:spec.lease_start + count] != spec.block_ids:
                log.warning("speckv: a load's blocks are not its lookup's; loading them over gRPC")
                return self._load_grpc(spec)
            if self._shared is None or not self._shared.usable(lease):
                return self._load_grpc(spec)
            return self._copy_leased(spec, lease, spec.lease_start)
        finally:
            self._submit(lambda: self._client.release(lease))

    def _copy_leased(self, spec: LoadSpec, lease: ReadLease, start: int) -> str | None:
        """Copies the lease's blocks [start, start + len(spec)) into the
        spec's pages; None when the copy ended after the lease (the pages may
        have been reused under it)."""
        copying = time.perf_counter()
        for medium, (positions, pool_pages) in lease.by_medium(start, len(spec.block_ids)).items():
            pool_to_pages(self._pages, self._pool(medium), pool_pages, [spec.page_ids[i] for i in positions])
        self._counters.add(load_copy_seconds=time.perf_counter() - copying)
        if time.monotonic() > lease.until:
            self._counters.add(load_failures=1)
            log.warning("speckv: a load of %d blocks outlasted its pin lease; the engine recomputes them",
                        len(spec.block_ids))
            return None
        return "shm"

    def _pool(self, medium: str) -> np.ndarray:
        """The mapped pool's bytes as the pages' unsigned ints (asked per
        call: the port may have mapped the pools again since the last one)."""
        assert self._shared is not None
        return raw(self._shared.pool(medium))

    def save(self, plan: StepPlan) -> None:
        if not plan.saves or not self._pages:
            return
        started = time.perf_counter()
        for spec in plan.saves:
            if self._shared is not None:
                self._save_shared(spec)
                continue
            blocks = gather_blocks(self._pages, spec.page_ids)
            data = [blocks[i].tobytes() for i in range(len(spec.page_ids))]
            self._submit(lambda spec=spec, data=data: self._client.put(
                spec.block_ids, spec.parents, spec.family, data), dropped=len(data))
        self._counters.add(save_seconds=time.perf_counter() - started)

    def _save_shared(self, spec: SaveSpec) -> None:
        shared = self._shared
        assert shared is not None
        slot = shared.reserve(spec.block_ids, spec.parents[0], spec.family)
        if slot is None:
            return
        if slot.positions:
            pages_to_pool(self._pages, [spec.page_ids[i] for i in slot.positions], self._pool(slot.medium),
                          list(slot.pages))
        self._submit(lambda: shared.commit(slot), dropped=len(slot.positions))

    def _submit(self, call: Callable[[], object], dropped: int = 0) -> None:
        """Runs call on the sender thread; when the queue is full it is
        dropped (a save's blocks stay engine-only, a reservation or pin is
        ended by its lease)."""
        try:
            self._queue.put_nowait(call)
        except queue.Full:
            if dropped:
                self._counters.add(save_failures=1)
                log.warning("speckv: save queue full; %d blocks stay engine-only", dropped)

    def _send_loop(self) -> None:
        while True:
            call = self._queue.get()
            try:
                if call is None:
                    return
                call()
            except Exception:  # noqa: BLE001 - a port fails open; anything else must not end the thread
                log.exception("speckv: a queued kvstore call failed")
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every queued save has been sent (or has failed)."""
        self._queue.join()

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self._background.shutdown()
        self.flush()
        self._queue.put(None)
        self._sender.join(timeout=5.0)
