"""The scheduler's flags for `speckv bench e2e --engine vllm`: every engine's
events beside its kvstore, probed at the server port it will be started on."""
from pathlib import Path

from speckv.loadgen.bench.e2e.vllm_engines import VllmModel, _http_port, scheduler_events, with_events
from speckv.loadgen.engines.vllm_jobs import layout_digest
from speckv.services.common.geometry import KVGeometry
from speckv.services.scheduler.adapters.vllm_spec import parse_kv_events

GEOMETRY = KVGeometry(name="", num_layers=4, num_kv_heads=4, head_dim=64, dtype="float32", block_size=32)


def test_each_engine_is_indexed_beside_its_kvstore_and_probed_where_it_serves():
    model = with_events(VllmModel(Path("/models/tiny"), "tiny", None), 2)  # type: ignore[arg-type]
    flag, value = scheduler_events(model, GEOMETRY)
    feeds = parse_kv_events(value)
    assert flag == "--kv-events" and [f.node_id for f in feeds] == ["node-0", "node-1"]
    assert all(f.kvstore and f.digest == layout_digest("tiny", GEOMETRY) for f in feeds)
    assert [f.endpoint for f in feeds] == [f"tcp://127.0.0.1:{p}" for p in model.events_ports]
    assert [f.health for f in feeds] == [f"http://127.0.0.1:{_http_port(model, n)}/health"
                                         for n in ("node-0", "node-1")]  # the port its server is given


def test_without_event_ports_no_engine_is_indexed():
    assert scheduler_events(VllmModel(Path("/models/tiny"), "tiny", None), GEOMETRY) == []  # type: ignore[arg-type]
