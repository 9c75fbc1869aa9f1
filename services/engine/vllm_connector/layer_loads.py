"""A step's loads copied layer by layer beside its forward (the connector's
`load_by_layer`; off by default, docs/vllm_connector.md says why).

vLLM 0.32 calls start_load_kv before a step's forward when the step has
loads (SchedulerOutput.has_sync_kv_loads), and, in every attention layer,
wait_for_layer_load(layer) before the attention reads the layer's pages
(model_executor/layers/attention/kv_transfer_utils.py, the CPU model runner
included). So start() hands the step's loads to one thread, which readies
them all (the kvstore calls: page_loads.py), then copies layer 0 of every
load and signals it, then layer 1, ...; wait_layer(i) waits for layer i
only, and layer i's attention runs while layer i + 1 is copied.

Invariants:
- every layer of a step is signalled exactly once, also when a load fails
  or raises, so the forward never waits forever; a layer's signal means
  every load that will ever write that layer has written it;
- a load that fails (not readied, a copy raised, or ended past its pin
  lease) has its pages returned by finish(), which waits for the whole
  step: the connector calls it before vLLM asks for load errors
  (wait_for_save, get_block_ids_with_load_errors), so a bad block is
  reported and recomputed, never served as loaded;
- one step at a time: start() finishes the previous step first.
"""
from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Generic, Protocol, Sequence, TypeVar

from speckv.services.engine.vllm_connector.plan import LoadSpec

log = logging.getLogger("speckv.vllm_connector")
Ready = TypeVar("Ready")


class StagedLoads(Protocol[Ready]):
    """A load's three stages (page_loads.PageLoader)."""

    def ready(self, spec: LoadSpec) -> Ready | None: ...

    def copy_layer(self, ready: Ready, layer: int) -> None: ...

    def end(self, ready: Ready, copied: bool = True) -> bool: ...


@dataclass(slots=True)
class _Step:
    layers: list[threading.Event]
    done: threading.Event = field(default_factory=threading.Event)
    failed_pages: set[int] = field(default_factory=set)


class LayerLoads(Generic[Ready]):
    def __init__(self, loads: StagedLoads[Ready], num_layers: int) -> None:
        self._loads = loads
        self._num_layers = num_layers
        self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="speckv-layer-load")
        self._step: _Step | None = None  # the step in flight or not yet finished

    def start(self, specs: Sequence[LoadSpec]) -> set[int]:
        """Starts a step's loads; the previous step's failed pages (finish())."""
        failed = self.finish()
        if specs:
            step = _Step([threading.Event() for _ in range(self._num_layers)])
            self._step = step
            self._pool.submit(self._run, step, list(specs))
        return failed

    def wait_layer(self, layer: int) -> None:
        """Returns once `layer` of the step's loads is in the pages (at once without a step)."""
        step = self._step
        if step is not None and 0 <= layer < len(step.layers):
            step.layers[layer].wait()

    def finish(self) -> set[int]:
        """Waits for the step's loads to end; the pages of those that failed (once)."""
        step, self._step = self._step, None
        if step is None:
            return set()
        step.done.wait()
        return step.failed_pages

    def _run(self, step: _Step, specs: list[LoadSpec]) -> None:
        readied: list[tuple[LoadSpec, Ready]] = []
        broken: set[int] = set()  # positions in readied whose copy raised
        try:
            for spec in specs:
                ready = self._attempt(lambda spec=spec: self._loads.ready(spec))
                if ready is None:
                    step.failed_pages.update(spec.page_ids)
                else:
                    readied.append((spec, ready))
            for layer, signal in enumerate(step.layers):
                for position, (_spec, ready) in enumerate(readied):
                    if position not in broken and not self._attempt(
                            lambda ready=ready, layer=layer: self._loads.copy_layer(ready, layer) or True):
                        broken.add(position)
                signal.set()
        except Exception:  # noqa: BLE001 - should not happen (each stage is attempted); then nothing counts as loaded
            log.exception("speckv: layer-by-layer loads broke off; the engine recomputes their blocks")
            for spec in specs:
                step.failed_pages.update(spec.page_ids)
        finally:
            for signal in step.layers:
                signal.set()
            for position, (spec, ready) in enumerate(readied):
                copied = position not in broken
                if not self._attempt(lambda ready=ready, copied=copied: self._loads.end(ready, copied)):
                    step.failed_pages.update(spec.page_ids)
            step.done.set()

    @staticmethod
    def _attempt(call):
        """call(), or None when it raises (logged): a load fails open."""
        try:
            return call()
        except Exception:  # noqa: BLE001 - a load's failure costs a recompute, never the engine's step
            log.exception("speckv: a layer-by-layer load failed; the engine recomputes its blocks")
            return None

    def shutdown(self) -> None:
        self.finish()
        self._pool.shutdown(wait=True)
