"""The predictor is hard to break (issue 22, item 5), over gRPC: a far-future
now_s is INVALID_ARGUMENT and leaves later forecasts model-based; a
candidate booster that would crash the native library is a refused reload
(INVALID_ARGUMENT: its tree is checked first) while the old model keeps serving; malformed
manifests, overlong names and wrongly typed keys are never INTERNAL;
ReloadModel loads only names under the model root, never a path outside it."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from speckv.loadgen.bench.predictor.crafted import run_crafted
from speckv.loadgen.bench.predictor.damage import crashing_copy, deep_manifest, garbage_copy, manifest_variant, truncated_copy
from speckv.services.common.clock import ManualClock
from speckv.services.common.rpc.server import ServiceServer, open_channel
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc
from tests.support.predictor_synthetic import planted_arrivals

NOW = 5_000.0
FEED_S = 900.0
DEADLINE_S = 60.0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The predictor's model root; the candidates of a test are placed in it."""
    (tmp_path / "models").mkdir()
    return tmp_path / "models"


@pytest.fixture
def stub(model_dir: Path, root: Path) -> Iterator[predictor_pb2_grpc.PredictorStub]:
    config = PredictorConfig(port=0, window_s=900.0, model_dir=str(model_dir), model_root=str(root))
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
        stub: predictor_pb2_grpc.PredictorStub, model_dir: Path, root: Path) -> None:
    _feed(stub)
    before, _ = _model_based(stub)
    crashing_copy(model_dir, root / "crash")
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReloadModel(pb.ReloadModelRequest(name="crash"), timeout=DEADLINE_S)
    # refused by the booster check (booster_text.py) before LightGBM walks the tree; without it the
    # probe died of SIGABRT (FAILED_PRECONDITION), and a node the probe rows miss killed the server
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside the tree" in caught.value.details()
    info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
    assert (info.version, info.source) == ("lgbm-v1", str(model_dir))
    assert _model_based(stub)[0] == before
    # a good model still reloads after the refusal
    shutil.copytree(model_dir, root / "good")
    reloaded = stub.ReloadModel(pb.ReloadModelRequest(name="good"), timeout=DEADLINE_S)
    assert (reloaded.version, reloaded.source) == ("lgbm-v1", os.path.realpath(root / "good"))


def test_malformed_model_directories_are_never_internal(
        stub: predictor_pb2_grpc.PredictorStub, model_dir: Path, root: Path) -> None:
    def variant(name: str, **changes) -> str:
        manifest_variant(model_dir, root / name, **changes)
        return name

    deep_manifest(root / "deep")
    truncated_copy(model_dir, root / "truncated")
    garbage_copy(model_dir, root / "garbage")
    requests = {
        "deep JSON": pb.ReloadModelRequest(name="deep"),
        "truncated booster": pb.ReloadModelRequest(name="truncated"),
        "garbage booster": pb.ReloadModelRequest(name="garbage"),
        "features a number": pb.ReloadModelRequest(name=variant("features-number", features=5)),
        "files a list": pb.ReloadModelRequest(name=variant("files-list", files=["a"])),
        "feature_spec a string": pb.ReloadModelRequest(name=variant("spec-string", feature_spec="x")),
        "offset null": pb.ReloadModelRequest(name=variant("offset-null", offset=None)),
        "overlong name": pb.ReloadModelRequest(name="a" * 10_000),
        "overlong component": pb.ReloadModelRequest(name="b" * 300),
        "NUL in name": pb.ReloadModelRequest(name="x\x00y"),
        "overlong path": pb.ReloadModelRequest(path="/" + "a" * 10_000),
    }
    for what, request in requests.items():
        code = _code(lambda: stub.ReloadModel(request, timeout=DEADLINE_S))
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), (what, code)
    assert stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S).version == "lgbm-v1"


def test_path_outside_the_root_is_refused(stub: predictor_pb2_grpc.PredictorStub, model_dir: Path,
                                          root: Path, tmp_path: Path) -> None:
    """Only a name under the model root loads: a path (even of a good model),
    a name with '/' or '..', and a symlink in the root that leads out are
    refused with the caller's codes, and the model in service stays; a
    symlink to another directory of the root is followed."""
    outside = tmp_path / "outside"
    shutil.copytree(model_dir, outside)  # a good model, outside the root
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "escape-dangling").symlink_to(tmp_path / "nowhere")
    (root / "up").symlink_to("..", target_is_directory=True)
    invalid = {
        "absolute path in path": pb.ReloadModelRequest(path=str(outside)),
        "path and name both set": pb.ReloadModelRequest(path=str(outside), name="v1"),
        "relative path in path": pb.ReloadModelRequest(path="../outside"),
        "name with ..": pb.ReloadModelRequest(name="../outside"),
        "name ..": pb.ReloadModelRequest(name=".."),
        "name .": pb.ReloadModelRequest(name="."),
        "absolute path as name": pb.ReloadModelRequest(name=str(outside)),
        "name with /": pb.ReloadModelRequest(name="up/outside"),
        "hidden name": pb.ReloadModelRequest(name=".hidden"),
        "empty name": pb.ReloadModelRequest(),
    }
    for what, request in invalid.items():
        with pytest.raises(grpc.RpcError) as caught:
            stub.ReloadModel(request, timeout=DEADLINE_S)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert "name" in caught.value.details(), what
    for name in ("escape", "escape-dangling", "up"):  # well-formed names; the symlink is what forbids them
        with pytest.raises(grpc.RpcError) as caught:
            stub.ReloadModel(pb.ReloadModelRequest(name=name), timeout=DEADLINE_S)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, name
        assert "outside the model root" in caught.value.details() and str(tmp_path) not in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReloadModel(pb.ReloadModelRequest(name="absent"), timeout=DEADLINE_S)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
    assert (info.version, info.source) == ("lgbm-v1", str(model_dir))
    shutil.copytree(model_dir, root / "v2")
    (root / "current").symlink_to("v2", target_is_directory=True)
    reloaded = stub.ReloadModel(pb.ReloadModelRequest(name="current"), timeout=DEADLINE_S)
    assert reloaded.source == os.path.realpath(root / "v2")


CRAFTED_N = 14  # one directory of each mutation kind (loadgen/bench/predictor/kinds.py: KINDS)


def test_crafted_directories_never_kill_the_predictor_nor_answer_internal() -> None:
    """`speckv bench predictor --crafted` at a small N: a real predictor
    process, one crafted directory of each kind offered by ReloadModel;
    none kills or wedges it, none is INTERNAL, and after every reload the
    good model still serves finite forecasts (or the accepted one does)."""
    report = run_crafted(CRAFTED_N, seed=0, echo=lambda _line: None)
    totals = report["totals"]
    assert totals["tried"] == CRAFTED_N and len(report["per_kind"]) == len(report["kinds"])
    problems = [(r["kind"], r["variant"], r["code"], r["service"], r["service_detail"]) for r in report["reloads"]
                if r["code"] in ("INTERNAL", "UNAVAILABLE") or r["service"] != "ok"]
    assert (totals["deaths"], totals["wedged"], totals["internal"], totals["unhealthy"]) == (0, 0, 0, 0), problems
    assert totals["leaks"] == 0
    assert all(a.get("accepted_finite") for a in report["accepted"]), report["accepted"]
