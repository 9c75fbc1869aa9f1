"""The vLLM server launcher's pure parts: the command and environment a
server gets, the kvstore geometry read from a model's config.json, and
`speckv up --engine vllm`'s argument checks. (A real server runs in
tests/e2e/test_vllm_server.py.)"""
from __future__ import annotations

import json

import pytest

from speckv.services.cluster.up import parse_spec
from speckv.services.cluster.vllm_servers import (
    CONNECTOR_MODULE, VllmServerSpec, kvstore_geometry_args, model_geometry, server_command, server_environ)
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.rpc.tls import TlsFiles


def test_the_command_loads_the_connector_onto_the_nodes_kvstore():
    spec = VllmServerSpec("vllm-0", "/models/m", 8100, "127.0.0.1:5000", kv_events_endpoint="tcp://*:5557")
    command = server_command(spec)
    assert command[1:3] == ["-m", "speckv.services.cluster.vllm_main"]
    transfer = json.loads(command[command.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector_module_path"] == CONNECTOR_MODULE
    assert transfer["kv_connector_extra_config"] == {"kvstore": "127.0.0.1:5000"}
    assert transfer["kv_load_failure_policy"] == "recompute"
    assert json.loads(command[command.index("--kv-events-config") + 1])["endpoint"] == "tcp://*:5557"
    assert "--kv-transfer-config" not in server_command(VllmServerSpec("e", "/m", 1, ""))
    secured = VllmServerSpec("e", "/m", 1, "a:1", tls=TlsFiles("/t/c.pem", "/t/k.pem", "/t/ca.pem"))
    extra = json.loads(server_command(secured)[server_command(secured).index("--kv-transfer-config") + 1])
    assert extra["kv_connector_extra_config"] == {"kvstore": "a:1", "tls_cert": "/t/c.pem", "tls_key": "/t/k.pem",
                                                  "tls_ca": "/t/ca.pem"}
    pulling = VllmServerSpec("e", "/m", 1, "a:1", node_id="node-0", peers=(("node-1", "b:2"),))
    extra = json.loads(server_command(pulling)[server_command(pulling).index("--kv-transfer-config") + 1])
    assert extra["kv_connector_extra_config"] == {"kvstore": "a:1", "node_id": "node-0", "peers": {"node-1": "b:2"}}


def test_the_environment_binds_a_core_and_drops_the_hash_seed():
    env = server_environ(VllmServerSpec("vllm-1", "/m", 1, "a:1", core=3), {"PYTHONHASHSEED": "7", "PATH": "/bin"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "3" and "PYTHONHASHSEED" not in env and env["PATH"] == "/bin"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"


def test_kvstore_geometry_comes_from_the_models_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "hidden_size": 512}))
    assert kvstore_geometry_args(tmp_path, "float32", 32) == [
        "--num-layers", "4", "--num-kv-heads", "4", "--head-dim", "64", "--dtype", "float32", "--block-size", "32"]
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidArgument, match="config.json"):
        kvstore_geometry_args(tmp_path, "float32", 32)


def test_up_with_vllm_needs_a_model(tmp_path):
    with pytest.raises(InvalidArgument, match="--model"):
        parse_spec(["--engine", "vllm"], {})
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64}))
    spec, args = parse_spec(["--engine", "vllm", "--model", str(tmp_path), "--nodes", "2"], {})
    assert spec.extra_args["kvstore"][:2] == ["--num-layers", "2"] and args.vllm_port_base == 8100


def test_up_with_vllm_indexes_each_engines_events_beside_its_kvstore(tmp_path):
    from speckv.services.engine.vllm_connector.identity import cpu_layout
    from speckv.services.scheduler.adapters.vllm_subscriber import parse_kv_events

    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64}))
    spec, _ = parse_spec(["--engine", "vllm", "--model", str(tmp_path), "--nodes", "2"], {})
    scheduler = spec.extra_args["scheduler"]
    assert scheduler[scheduler.index("--engine-profile") + 1] == "tiny-llama-vllm-cpu"  # 32-token blocks
    feeds = parse_kv_events(scheduler[scheduler.index("--kv-events") + 1])
    digest = cpu_layout(str(tmp_path), model_geometry(tmp_path, "float32", 32)).digest()
    assert [(f.node_id, f.endpoint, f.kvstore, f.digest, f.health) for f in feeds] == [
        ("node-0", "tcp://127.0.0.1:8200", True, digest, "http://127.0.0.1:8100/health"),
        ("node-1", "tcp://127.0.0.1:8201", True, digest, "http://127.0.0.1:8101/health")]  # each engine's server
    with pytest.raises(InvalidArgument, match="block size"):
        parse_spec(["--engine", "vllm", "--model", str(tmp_path), "--engine-profile", "llama-3-8b-h100"], {})
