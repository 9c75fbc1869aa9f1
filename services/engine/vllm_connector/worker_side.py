"""The connector's worker half: fills the engine's pages from the kvstore
before a step's forward (start_load_kv) and saves the step's newly computed
full blocks after it (wait_for_save).

Loads are synchronous: all of a step's blocks are read (GetBlocks, crc32c
checked) and scattered into every layer's pages in start_load_kv, so
wait_for_layer_load has nothing to wait for. A load that fails reports its
pages through get_block_ids_with_load_errors in the same step; with
kv_load_failure_policy "recompute" vLLM then recomputes them.

Saves copy the pages into canonical blocks in wait_for_save (the pages may
be reused once the step ends) and hand the bytes to a sender thread, so the
step does not wait on gRPC; shutdown (or flush) drains it.
"""
from __future__ import annotations

import logging
import queue
import re
import threading
import time
from typing import Sequence

import numpy as np
import torch

from speckv.services.engine.vllm_connector.identity import KVLayout
from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.port import KVStorePort
from speckv.services.engine.vllm_connector.pages import gather_blocks, page_views, scatter_blocks
from speckv.services.engine.vllm_connector.plan import SaveSpec, StepPlan

log = logging.getLogger("speckv.vllm_connector")
LAYER_INDEX = re.compile(r"\.(\d+)\.")
MAX_QUEUED_SAVES = 64  # steps of saves waiting for the sender; past that a save is dropped (counted)


def layer_order(names: Sequence[str]) -> list[str]:
    """Attention layer names in model order (by their first numeric part)."""
    def key(name: str) -> tuple[int, str]:
        match = LAYER_INDEX.search(name)
        return (int(match.group(1)) if match else -1, name)
    return sorted(names, key=key)


class WorkerSide:
    def __init__(self, layout: KVLayout, client: KVStorePort, counters: Counters) -> None:
        self._layout = layout
        self._client = client
        self._counters = counters
        self._views: list[torch.Tensor] = []
        self._load_errors: set[int] = set()
        self._queue: queue.Queue[tuple[SaveSpec, list[bytes]] | None] = queue.Queue(MAX_QUEUED_SAVES)
        self._sender = threading.Thread(target=self._send_loop, name="speckv-save", daemon=True)
        self._sender.start()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = layer_order(list(kv_caches))
        if len(names) != self._layout.num_layers:
            raise ValueError(f"SpeckvConnector: {len(names)} KV cache layers, the layout says "
                             f"{self._layout.num_layers}")
        self._views = page_views([kv_caches[n] for n in names], self._layout.num_kv_heads,
                                 self._layout.block_size, self._layout.head_dim)

    def _block_shape(self, count: int) -> tuple[int, ...]:
        layout = self._layout
        return (count, layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)

    def load(self, plan: StepPlan) -> None:
        for spec in plan.loads:
            started = time.perf_counter()
            data = self._client.get(spec.block_ids) if self._views else None
            if data is None:
                self._load_errors.update(spec.page_ids)
                continue
            scatter_blocks(self._views, spec.page_ids, self._staged(data))
            self._counters.add(blocks_loaded=len(data), bytes_loaded=sum(len(d) for d in data),
                               load_seconds=time.perf_counter() - started)

    def _staged(self, data: list[bytes]) -> torch.Tensor:
        """The blocks' bytes as one canonical tensor, in one copy (NumPy
        copies from the immutable gRPC bytes without torch's read-only warning)."""
        size = len(data[0])
        staging = np.empty(size * len(data), dtype=np.uint8)
        for i, block in enumerate(data):
            staging[i * size:(i + 1) * size] = np.frombuffer(block, dtype=np.uint8)
        dtype = self._views[0].dtype
        return torch.from_numpy(staging).view(dtype).view(self._block_shape(len(data)))

    def save(self, plan: StepPlan) -> None:
        for spec in plan.saves:
            if not self._views:
                return
            blocks = gather_blocks(self._views, spec.page_ids)
            data = [blocks[i].numpy().tobytes() for i in range(len(spec.page_ids))]
            try:
                self._queue.put_nowait((spec, data))
            except queue.Full:
                self._counters.add(save_failures=1)
                log.warning("speckv: save queue full; %d blocks stay engine-only", len(data))

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                spec, data = item
                self._client.put(spec.block_ids, spec.parents, spec.family, data)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every queued save has been sent (or has failed)."""
        self._queue.join()

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self.flush()
        self._queue.put(None)
        self._sender.join(timeout=5.0)
