"""ReloadModel's errors name the model by the caller's name and never show
the server's paths (issue 43, item 5): each way a reload fails, over real
gRPC on loopback, answers its status with no absolute path of the server in
the message; the server's log keeps the path."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from speckv.loadgen.bench.predictor.damage import crashing_copy, deep_manifest, garbage_copy, manifest_variant, truncated_copy
from speckv.services.common.clock import ManualClock
from speckv.services.common.rpc.server import ServiceServer, open_channel
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server
from speckv.services.predictor.serving.manifest import write_manifest
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc

DEADLINE_S = 60.0
ABSOLUTE_PATH = re.compile(r"(^|[\s'\"(=:,\[])/[A-Za-z0-9._-]")  # a '/' that starts a path, not one inside '<model root>/x'
Code = grpc.StatusCode


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[predictor_pb2_grpc.PredictorStub, Path]]:
    root = tmp_path / "models"
    root.mkdir()
    with serving(PredictorConfig(port=0, grace_s=0.5, model_root=str(root))) as stub:
        yield stub, root


class serving:  # a context manager: the predictor in this process and a stub to it
    def __init__(self, config: PredictorConfig) -> None:
        config.validate()
        self._server: ServiceServer = build_server(config, build_telemetry("predictor", {}),
                                                   clock=ManualClock(5_000.0)).start()
        self._channel = open_channel(self._server.address, None)

    def __enter__(self) -> predictor_pb2_grpc.PredictorStub:
        return predictor_pb2_grpc.PredictorStub(self._channel)

    def __exit__(self, *_: object) -> None:
        self._channel.close()
        self._server.stop(grace_s=0.5)


def refusal(stub: predictor_pb2_grpc.PredictorStub, name: str) -> tuple[Code, str]:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReloadModel(pb.ReloadModelRequest(name=name), timeout=DEADLINE_S)
    return caught.value.code(), caught.value.details() or ""


def assert_no_server_path(details: str, *paths: Path) -> None:
    for path in (*paths, Path.cwd()):
        for spelling in {str(path), os.path.realpath(path)}:
            assert spelling not in details, details
    assert ABSOLUTE_PATH.search(details) is None, details


def place_candidates(root: Path, model_dir: Path, outside: Path) -> dict[str, Code]:
    """One directory under root per way a reload fails, and its status."""
    (root / "no-manifest").mkdir()
    (root / "manifest-a-directory" / "manifest.json").mkdir(parents=True)
    (root / "bad-json").mkdir()
    (root / "bad-json" / "manifest.json").write_text("{not json")
    (root / "not-an-object").mkdir()
    (root / "not-an-object" / "manifest.json").write_text("[1, 2]")
    (root / "not-utf8").mkdir()
    (root / "not-utf8" / "manifest.json").write_bytes(b"\xff\xfe{}")
    deep_manifest(root / "deep")
    write_manifest(root / "unknown-key", {"kind": "ewma", "version": "v", "horizons_s": [1], "quantile": 0.9,
                                          "halflife": 3})
    write_manifest(outside / "elsewhere", {"kind": "ewma", "version": "v", "horizons_s": [1], "quantile": 0.9})
    (root / "manifest-leads-out").mkdir()
    (root / "manifest-leads-out" / "manifest.json").symlink_to(outside / "elsewhere" / "manifest.json")
    manifest_variant(model_dir, root / "features-a-number", features=5)
    truncated_copy(model_dir, root / "truncated")
    garbage_copy(model_dir, root / "garbage")
    crashing_copy(model_dir, root / "crashing")
    shutil.copytree(model_dir, root / "booster-gone")
    booster = json.loads((root / "booster-gone" / "manifest.json").read_text())["files"]["count"][0]
    (root / "booster-gone" / booster).unlink()
    shutil.copytree(model_dir, root / "booster-leads-out")
    (root / "booster-leads-out" / booster).unlink()
    shutil.copy(model_dir / booster, outside / booster)
    (root / "booster-leads-out" / booster).symlink_to(outside / booster)
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "escape-dangling").symlink_to(outside / "nowhere")
    (root / "up").symlink_to("..", target_is_directory=True)
    return {"absent": Code.NOT_FOUND, "no-manifest": Code.NOT_FOUND, "manifest-a-directory": Code.NOT_FOUND,
            "bad-json": Code.INVALID_ARGUMENT, "not-an-object": Code.INVALID_ARGUMENT,
            "not-utf8": Code.INVALID_ARGUMENT, "deep": Code.INVALID_ARGUMENT, "unknown-key": Code.INVALID_ARGUMENT,
            "manifest-leads-out": Code.INVALID_ARGUMENT, "features-a-number": Code.FAILED_PRECONDITION,
            "truncated": Code.INVALID_ARGUMENT, "garbage": Code.INVALID_ARGUMENT,
            "crashing": Code.INVALID_ARGUMENT, "booster-gone": Code.INVALID_ARGUMENT,
            "booster-leads-out": Code.INVALID_ARGUMENT, "escape": Code.FAILED_PRECONDITION,
            "escape-dangling": Code.FAILED_PRECONDITION, "up": Code.FAILED_PRECONDITION}


def test_every_reload_failure_has_its_status_and_no_server_path(served, model_dir: Path, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    stub, root = served
    outside = tmp_path / "outside"
    outside.mkdir()
    expected = place_candidates(root, model_dir, outside)
    with caplog.at_level(logging.WARNING, logger="speckv.services.predictor.servicer"):
        for name, code in expected.items():
            got, details = refusal(stub, name)
            assert got == code, (name, got, details)
            assert_no_server_path(details, tmp_path, model_dir)
            assert repr(name) in details, (name, details)  # named as the caller named it
    for name in ("../outside", "a/b", "..", ".hidden"):  # malformed names: refused before the root is read
        got, details = refusal(stub, name)
        assert got == Code.INVALID_ARGUMENT and "name" in details, (name, details)
        assert_no_server_path(details, tmp_path, model_dir)
    assert stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S).version == "builtin-ewma"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"model root {root}" in logged  # the server's log keeps where it looked


def test_a_probe_timeout_names_the_model_not_its_path(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_manifest(root / "good", {"kind": "ewma", "version": "v2", "horizons_s": [1], "quantile": 0.5})
    config = PredictorConfig(port=0, grace_s=0.5, model_root=str(root), reload_probe_timeout_s=0.001)
    with serving(config) as stub:
        code, details = refusal(stub, "good")
    assert code == Code.FAILED_PRECONDITION and "'good'" in details and "within" in details, details
    assert_no_server_path(details, tmp_path)


def test_a_model_root_that_is_no_directory_is_not_shown(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with serving(PredictorConfig(port=0, grace_s=0.5, model_root=str(tmp_path / "a-file"))) as stub:
        code, details = refusal(stub, "v2")
    assert code == Code.FAILED_PRECONDITION and "not a directory" in details, details
    assert_no_server_path(details, tmp_path)
