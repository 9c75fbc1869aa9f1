"""The predictor is hard to break (issue 22, item 5), over gRPC: a far-future
now_s is INVALID_ARGUMENT and leaves later forecasts model-based; a
candidate booster that crashes the native library is a refused reload
(FAILED_PRECONDITION) while the old model keeps serving; malformed
manifests, overlong paths and wrongly typed keys are never INTERNAL."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.server import ServiceServer, open_channel
from speckv.services.common.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.manifest import MANIFEST_NAME
from speckv.services.predictor.server import build_server
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc
from tests.support.predictor_synthetic import planted_arrivals

NOW = 5_000.0
FEED_S = 900.0
DEADLINE_S = 60.0


def crashing_copy(model_dir: Path, target: Path) -> Path:
    """A copy of model_dir whose first booster's first tree points at child
    node 1,000,000: LightGBM parses it and aborts the process when it walks
    the tree (checked: SIGABRT, 'terminate called without an active exception')."""
    shutil.copytree(model_dir, target)
    booster = target / json.loads((target / MANIFEST_NAME).read_text())["files"]["count"][0]
    text, replaced = re.subn(r"left_child=-?\d+", "left_child=1000000", booster.read_text(), count=1)
    assert replaced == 1
    booster.write_text(text)
    return target


@pytest.fixture
def stub(model_dir: Path) -> Iterator[predictor_pb2_grpc.PredictorStub]:
    config = PredictorConfig(port=0, window_s=900.0, model_dir=str(model_dir))
    config.validate()
    server: ServiceServer = build_server(config, build_telemetry("predictor", {}), clock=ManualClock(NOW)).start()
    channel = open_channel(server.address, None)
    try:
        yield predictor_pb2_grpc.PredictorStub(channel)
    finally:
        channel.close()
        server.stop(grace_s=0.5)


def _feed(stub: predictor_pb2_grpc.PredictorStub) -> None:
    times, names = planted_arrivals(FEED_S, seed=9, start_s=NOW - FEED_S)
    stream = (pb.Arrival(time_s=float(t), family=n) for t, n in zip(times, names))
    summary = stub.ObserveArrivals(stream, timeout=DEADLINE_S)
    assert summary.rejected == 0, summary.first_error


def _model_based(stub: predictor_pb2_grpc.PredictorStub) -> tuple[float, float]:
    """(steady-a's 10 s expected count, a never-seen family's): the first
    follows steady-a's 1/s history, the second is the model's prior."""
    response = stub.Forecast(pb.ForecastRequest(families=["steady-a", "never-seen"]), timeout=DEADLINE_S)
    return response.forecasts[0].horizons[3].expected_count, response.forecasts[1].horizons[3].expected_count


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.details()
    return caught.value.code()


def test_far_future_now_is_refused_and_later_forecasts_stay_model_based(
        stub: predictor_pb2_grpc.PredictorStub) -> None:
    _feed(stub)
    before, prior = _model_based(stub)
    assert 4.0 < before < 20.0 and abs(before - prior) > 1.0
    far = pb.ForecastRequest(families=["steady-a"], now_s=NOW + 1e6)
    assert _code(lambda: stub.Forecast(far, timeout=DEADLINE_S)) == grpc.StatusCode.INVALID_ARGUMENT
    top = pb.ForecastRequest(max_families=3, now_s=NOW + 1e6)
    assert _code(lambda: stub.Forecast(top, timeout=DEADLINE_S)) == grpc.StatusCode.INVALID_ARGUMENT
    after, _ = _model_based(stub)
    assert after == before  # same clock, same series: the refused call changed nothing


def test_crashing_booster_is_a_refused_reload_and_the_old_model_keeps_serving(
        stub: predictor_pb2_grpc.PredictorStub, model_dir: Path, tmp_path: Path) -> None:
    _feed(stub)
    before, _ = _model_based(stub)
    bad = crashing_copy(model_dir, tmp_path / "crash")
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReloadModel(pb.ReloadModelRequest(path=str(bad)), timeout=DEADLINE_S)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "probe process died" in caught.value.details()
    info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
    assert (info.version, info.source) == ("lgbm-v1", str(model_dir))
    assert _model_based(stub)[0] == before
    # a good model still reloads after the refusal
    assert stub.ReloadModel(pb.ReloadModelRequest(path=str(model_dir)), timeout=DEADLINE_S).version == "lgbm-v1"


def test_malformed_model_directories_are_never_internal(
        stub: predictor_pb2_grpc.PredictorStub, model_dir: Path, tmp_path: Path) -> None:
    manifest = json.loads((model_dir / MANIFEST_NAME).read_text())

    def variant(name: str, **changes) -> str:
        target = tmp_path / name
        shutil.copytree(model_dir, target)
        (target / MANIFEST_NAME).write_text(json.dumps({**manifest, **changes}))
        return str(target)

    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / MANIFEST_NAME).write_text("[" * 100_000 + "]" * 100_000)
    truncated = tmp_path / "truncated"
    shutil.copytree(model_dir, truncated)
    booster = truncated / manifest["files"]["count"][0]
    booster.write_text(booster.read_text()[:200])
    garbage = tmp_path / "garbage"
    shutil.copytree(model_dir, garbage)
    (garbage / manifest["files"]["count"][0]).write_bytes(b"\xff\xfe tree garbage \x00" * 50)
    paths = {
        "deep JSON": str(deep),
        "truncated booster": str(truncated),
        "garbage booster": str(garbage),
        "features a number": variant("features-number", features=5),
        "files a list": variant("files-list", files=["a"]),
        "feature_spec a string": variant("spec-string", feature_spec="x"),
        "offset null": variant("offset-null", offset=None),
        "overlong path": "/" + "a" * 10_000,
        "overlong component": str(tmp_path / ("b" * 300)),
        "NUL in path": str(tmp_path) + "/x\x00y",
    }
    for what, path in paths.items():
        code = _code(lambda: stub.ReloadModel(pb.ReloadModelRequest(path=path), timeout=DEADLINE_S))
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), (what, code)
    assert stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S).version == "lgbm-v1"
