"""LayerLoads: a step's loads readied first, then copied layer by layer on a
thread; wait_layer(i) returns once every load has written layer i, while
layer i + 1 may still be loading; a load that fails (ready, copy or end)
reports its pages from finish(), and no failure leaves a layer unsignalled."""
import threading

import pytest

from speckv.services.engine.vllm_connector.layer_loads import LayerLoads
from speckv.services.engine.vllm_connector.plan import LoadSpec

LAYERS = 4
PATIENCE_S = 10.0  # only a bound on a broken test; no assertion depends on it


class GatedLoads:
    """StagedLoads whose copies of layer i wait until gates[i] opens;
    records every stage in order."""

    def __init__(self, fail_ready=(), raise_ready=(), raise_copy=(), fail_end=()):
        self.gates = [threading.Event() for _ in range(LAYERS)]
        self.log: list[tuple] = []
        self.lock = threading.Lock()
        self.fail_ready, self.raise_ready = set(fail_ready), set(raise_ready)
        self.raise_copy, self.fail_end = dict(raise_copy), set(fail_end)  # raise_copy: req -> layer

    def record(self, *event):
        with self.lock:
            self.log.append(event)

    def ready(self, spec):
        self.record("ready", spec.req_id)
        if spec.req_id in self.raise_ready:
            raise RuntimeError("ready broke")
        return None if spec.req_id in self.fail_ready else spec.req_id

    def copy_layer(self, ready, layer):
        assert self.gates[layer].wait(PATIENCE_S)
        if self.raise_copy.get(ready) == layer:
            raise RuntimeError("copy broke")
        self.record("copy", ready, layer)

    def end(self, ready, copied=True):
        self.record("end", ready, copied)
        return copied and ready not in self.fail_end

    def copied(self, layer):
        with self.lock:
            return {e[1] for e in self.log if e[0] == "copy" and e[2] == layer}


def specs(*reqs):
    return [LoadSpec(req, (10 * i, 10 * i + 1), (100 + i,)) for i, req in enumerate(reqs)]


def open_all(loads):
    for gate in loads.gates:
        gate.set()


def test_wait_layer_returns_when_that_layer_is_in_and_the_next_is_still_loading():
    loads = GatedLoads()
    layers = LayerLoads(loads, LAYERS)
    layers.start(specs("a", "b"))
    for layer in range(LAYERS):
        loads.gates[layer].set()
        layers.wait_layer(layer)
        assert loads.copied(layer) == {"a", "b"}  # every load has written this layer ...
        if layer + 1 < LAYERS:
            assert loads.copied(layer + 1) == set()  # ... and none the next, still held
    assert layers.finish() == set()
    layers.shutdown()


def test_loads_are_readied_before_any_copy_and_copied_layer_by_layer_in_order():
    loads = GatedLoads()
    open_all(loads)
    layers = LayerLoads(loads, LAYERS)
    layers.start(specs("a", "b"))
    assert layers.finish() == set()
    stages = [e for e in loads.log]
    assert stages[:2] == [("ready", "a"), ("ready", "b")]
    assert stages[2:2 + 2 * LAYERS] == [("copy", r, layer) for layer in range(LAYERS) for r in ("a", "b")]
    assert sorted(stages[2 + 2 * LAYERS:]) == [("end", "a", True), ("end", "b", True)]
    layers.shutdown()


@pytest.mark.parametrize("failure", ["fail_ready", "raise_ready", "raise_copy", "fail_end"])
def test_a_failed_load_reports_its_pages_every_layer_is_still_signalled_and_the_others_load(failure):
    argument = {"raise_copy": {"b": 1}}.get(failure, {"b"})
    loads = GatedLoads(**{failure: argument})
    open_all(loads)
    layers = LayerLoads(loads, LAYERS)
    layers.start(specs("a", "b", "c"))
    for layer in range(LAYERS):
        layers.wait_layer(layer)  # returns: no failure leaves a layer unsignalled
        assert {"a", "c"} <= loads.copied(layer)
    assert layers.finish() == {10, 11}  # b's pages, whatever stage failed
    assert layers.finish() == set()  # reported once
    if failure == "raise_copy":
        assert loads.copied(2) == {"a", "c"} and ("end", "b", False) in loads.log  # its pins still released
    layers.shutdown()


def test_a_step_without_loads_waits_for_nothing():
    loads = GatedLoads()  # every gate closed: a copy would block
    layers = LayerLoads(loads, LAYERS)
    assert layers.start([]) == set()
    layers.wait_layer(0)
    layers.wait_layer(LAYERS - 1)
    assert layers.finish() == set() and loads.log == []
    layers.shutdown()


def test_the_next_step_first_finishes_the_previous_and_returns_its_failures():
    loads = GatedLoads(fail_ready={"a"})
    open_all(loads)
    layers = LayerLoads(loads, LAYERS)
    layers.start(specs("a"))
    assert layers.start(specs("x", "b")) == {0, 1}  # a's pages, from the step before
    assert layers.finish() == set()
    assert loads.copied(LAYERS - 1) == {"b", "x"}
    layers.shutdown()
