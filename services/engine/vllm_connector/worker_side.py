"""The connector's worker half: fills the engine's pages from the kvstore
for a step's forward (start_load_kv, wait_for_layer_load) and saves the
step's newly computed full blocks after it (wait_for_save).

Two paths, chosen once when the connector starts: the same-host one when
the kvstore's pools are mapped here (a SharedPort, shared_client.py), else
gRPC (page_loads.py says how a load readies and copies on each). A step's
loads are copied whole in start_load_kv, before its forward, or with
`load_by_layer` layer by layer on a thread beside it (layer_loads.py:
wait_for_layer_load(i) waits for layer i only). Either way a
load that fails reports its pages through get_block_ids_with_load_errors
in the same step; with kv_load_failure_policy "recompute" vLLM then
recomputes them. With `load_async` the same loads run on a background
thread instead (background_loads.py) and end as finished (or failed)
receives.

Saves: same host, a save reserves pages (Reserve with shared_memory),
copies the step's pages straight into them in wait_for_save (the engine may
reuse its pages once the step ends) and leaves the checksums and Commit to
the sender thread; over gRPC it copies the pages into canonical blocks and
the sender thread PutBlocks them.

The sender thread runs queued calls in order (commits, puts, the release
of pins), so the step never waits on them; shutdown (or flush) drains it.
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
from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.identity import KVLayout
from speckv.services.engine.vllm_connector.layer_loads import LayerLoads
from speckv.services.engine.vllm_connector.page_loads import PageLoader, ReadyLoad
from speckv.services.engine.vllm_connector.pages import (
    PageKind, Pages, block_bytes, gather_blocks, page_arrays, page_views, pages_to_pool, raw)
from speckv.services.engine.vllm_connector.plan import SaveSpec, StepPlan
from speckv.services.engine.vllm_connector.port import KVStorePort, PeerPort, PullTarget, SharedPort

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
                 pull_target: PullTarget | Callable[[], PullTarget | None] | None = None,
                 load_by_layer: bool = False) -> None:
        """peers: the peers' kvstores by node id; pull_target: this node as
        pulls name it, or how to find it out (None: pulls fail open); load_by_layer: a step's loads
        beside its forward, layer by layer (else whole, before it)."""
        self._layout = layout
        self._client = client
        self._shared = shared
        self._counters = counters
        self._pages: list[Pages] = []  # each layer's pages [blocks, 2, N, H, C] as unsigned ints (pages.py)
        self._layer_index: dict[str, int] = {}  # vLLM's attention layer name -> its position in _pages
        self._load_errors: set[int] = set()
        self._queue: queue.Queue[Callable[[], object] | None] = queue.Queue(MAX_QUEUED_SAVES)
        self._sender = threading.Thread(target=self._send_loop, name="speckv-save", daemon=True)
        self._sender.start()
        self._loader = PageLoader(client, counters, self._submit, shared, peers, pull_target)
        self._background = BackgroundLoads(self._loader.load)
        self._layers: LayerLoads[ReadyLoad] | None = \
            LayerLoads(self._loader, layout.num_layers) if load_by_layer else None

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = layer_order(list(kv_caches))
        if len(names) != self._layout.num_layers:
            raise ValueError(f"SpeckvConnector: {len(names)} KV cache layers, the layout says "
                             f"{self._layout.num_layers}")
        layout = self._layout
        views = page_views([kv_caches[n] for n in names], layout.num_kv_heads, layout.block_size, layout.head_dim,
                           PageKind(layout.page_layout))
        self._pages = page_arrays(views)
        self._layer_index = {name: i for i, name in enumerate(names)}
        self._loader.pages = self._pages
        self._loader.block_shape = (layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)
        self._loader.block_bytes = block_bytes(self._pages)

    @property
    def shared(self) -> bool:
        """Whether KV moves through the kvstore's mapped pools."""
        return self._shared is not None

    def load(self, plan: StepPlan) -> None:
        """The step's loads: plan.loads for this step's forward (layer by
        layer beside it, or whole now; a failure reports its pages as load
        errors), plan.async_loads on the background thread."""
        if self._layers is not None:
            self._load_errors |= self._layers.start(plan.loads)
        else:
            for spec in plan.loads:
                if not self._loader.load(spec):
                    self._load_errors.update(spec.page_ids)
        if plan.async_loads:
            self._background.start(plan.async_loads)

    def wait_for_layer(self, layer_name: str) -> None:
        """Returns once the step's loads have written this layer's pages."""
        if self._layers is not None:
            # A name not registered (none should be) waits for every layer: never a page half written.
            self._layers.wait_layer(self._layer_index.get(layer_name, self._layout.num_layers - 1))

    def finish_loads(self) -> None:
        """Waits for the step's loads (all layers); their failures become load errors."""
        if self._layers is not None:
            self._load_errors |= self._layers.finish()

    def take_finished_loads(self) -> tuple[set[str], set[str]]:
        """Requests whose background loads ended since the last call, and of those the failed."""
        return self._background.take_finished()

    def _pool(self, medium: str) -> np.ndarray:
        """The mapped pool's bytes as the pages' unsigned ints (asked per
        call: the port may have mapped the pools again since the last one)."""
        assert self._shared is not None
        return raw(self._shared.pool(medium))

    def save(self, plan: StepPlan) -> None:
        self.finish_loads()  # the step's forward is over: its loads end with it
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
        self.finish_loads()
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self._layers is not None:
            self._layers.shutdown()
        self._background.shutdown()
        self.flush()
        self._queue.put(None)
        self._sender.join(timeout=5.0)
