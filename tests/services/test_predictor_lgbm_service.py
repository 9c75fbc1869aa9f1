"""The predictor server with LightGBM: forecasts from a stream fed over gRPC,
and background retraining swapping models while Forecast keeps answering."""
from __future__ import annotations

import json
import math
import shutil
import threading
import time
from pathlib import Path

import grpc

from speckv.services.common.clock import ManualClock
from speckv.services.common.rpc.server import ServiceServer, open_channel
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server
from speckv.services.predictor.serving import compiled_trees
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc
from tests.support.predictor_synthetic import planted_arrivals

NOW = 5_000.0
FEED_S = 900.0
DEADLINE_S = 60.0


def _serve(config: PredictorConfig) -> ServiceServer:
    config.validate()
    return build_server(config, build_telemetry("predictor", {}), clock=ManualClock(NOW)).start()


def _stub(server: ServiceServer) -> tuple[grpc.Channel, predictor_pb2_grpc.PredictorStub]:
    channel = open_channel(server.address, None)
    return channel, predictor_pb2_grpc.PredictorStub(channel)


def _feed(stub: predictor_pb2_grpc.PredictorStub) -> int:
    times, names = planted_arrivals(FEED_S, seed=9, start_s=NOW - FEED_S)
    stream = (pb.Arrival(time_s=float(t), family=n) for t, n in zip(times, names))
    summary = stub.ObserveArrivals(stream, timeout=DEADLINE_S)
    assert summary.rejected == 0, summary.first_error
    return summary.accepted


def test_lightgbm_forecasts_from_a_stream_fed_over_grpc(model_dir: Path) -> None:
    server = _serve(PredictorConfig(port=0, window_s=900.0, model_dir=str(model_dir)))
    channel, stub = _stub(server)
    try:
        assert _feed(stub) > 1000
        response = stub.Forecast(pb.ForecastRequest(families=["bursty", "steady-a", "steady-b", "new"]),
                                 timeout=DEADLINE_S)
        assert response.model_version == "lgbm-v1"
        bursty, steady_a, steady_b, new = response.forecasts
        assert [f.known for f in response.forecasts] == [True, True, True, False]
        assert [h.horizon_s for h in steady_a.horizons] == [1.0, 2.0, 5.0, 10.0]
        # steady-a arrives at 1/s, steady-b at 0.2/s: the 10 s forecasts say so
        assert 4.0 < steady_a.horizons[3].expected_count < 20.0
        assert steady_b.horizons[3].expected_count < steady_a.horizons[3].expected_count
        assert all(0.0 <= h.burst_probability <= 1.0 for f in response.forecasts for h in f.horizons)
        assert new.horizons[3].expected_count >= 0.0
        odd = stub.Forecast(pb.ForecastRequest(families=["steady-a"], horizons_s=[3.0]), timeout=DEADLINE_S)
        assert odd.forecasts[0].horizons[0].horizon_s == 3.0
        info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
        assert info.name == "lightgbm" and "level_hl120s" in info.features
    finally:
        channel.close()
        server.stop(grace_s=0.5)


def test_get_model_info_shows_the_served_choice_per_horizon_and_class(model_dir: Path) -> None:
    """The choice recorded in the manifest (selection.py) is what GetModelInfo
    shows over real gRPC: per horizon and family class, the forecaster or
    blend served, its weights and every candidate's validation MAE."""
    selection = json.loads((model_dir / "manifest.json").read_text())["point"]["selection"]
    server = _serve(PredictorConfig(port=0, window_s=900.0, model_dir=str(model_dir)))
    channel, stub = _stub(server)
    try:
        info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
        classes = selection["classes"]["names"]
        assert len(info.choices) == len(info.horizons_s) * len(classes) == len(selection["choices"])
        assert "level_hl120s" in info.family_classes and all(name in info.family_classes for name in classes)
        for shown, recorded in zip(info.choices, selection["choices"]):
            assert (shown.horizon_s, shown.family_class, shown.chosen) == (
                recorded["horizon_s"], recorded["family_class"], recorded["chosen"])
            assert {w.forecaster: w.weight for w in shown.weights} == recorded["weights"]
            assert abs(sum(w.weight for w in shown.weights) - 1.0) < 1e-9
            scores = {c.forecaster: c.validation_mae for c in shown.candidates}
            assert set(scores) == set(recorded["validation_mae"]) >= {"last-value", "ewma", "blend"}
            assert all(math.isnan(v) if recorded["validation_mae"][n] is None else v == recorded["validation_mae"][n]
                       for n, v in scores.items())
            assert shown.validation_rows == recorded["rows"] and shown.inherited == recorded["inherited"]
        busy = [c for c in info.choices if c.validation_rows > 0]
        assert busy and all(c.chosen in ("blend", *(w.forecaster for w in c.weights)) for c in busy)
    finally:
        channel.close()
        server.stop(grace_s=0.5)


def test_get_model_info_shows_the_burst_choice_per_horizon(model_dir: Path, tmp_path: Path) -> None:
    """The burst probability's source per horizon recorded in the manifest
    ("burst", "alarm_threshold"; burst_model.py) is what GetModelInfo shows
    over real gRPC, scores as recorded (null: NaN); a model without burst
    classifiers reloads and shows none."""
    manifest = json.loads((model_dir / "manifest.json").read_text())
    recorded = manifest["burst"]  # the test model is trained with the committed (quick) burst config
    server = _serve(PredictorConfig(port=0, window_s=900.0, model_dir=str(model_dir), model_root=str(tmp_path)))
    channel, stub = _stub(server)
    try:
        info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
        assert [b.horizon_s for b in info.burst_choices] == list(info.horizons_s) == manifest["horizons_s"]
        for i, shown in enumerate(info.burst_choices):
            assert shown.chosen == recorded["sources"][i] in ("classifier", "count-distribution")
            assert shown.alarm_threshold == manifest["alarm_threshold"][i]
            assert shown.validation_bursts == recorded["episodes"][i]
            scores = recorded["scores"][i]
            assert scores and [c.source for c in shown.candidates] == [n for n in ("classifier", "count-distribution")
                                                            if n in scores]
            for c in shown.candidates:
                for key in ("f1", "precision", "recall", "lead_s", "threshold"):
                    want = scores[c.source][key]
                    assert math.isnan(getattr(c, key)) if want is None else getattr(c, key) == want, (c.source, key)
        assert sum(b.validation_bursts for b in info.burst_choices) > 0  # planted bursts reach validation

        plain = shutil.copytree(model_dir, tmp_path / "no-burst")
        stripped = {k: v for k, v in manifest.items() if k != "burst"}
        stripped["files"] = {k: v for k, v in manifest["files"].items() if k != "burst"}
        for name in manifest["files"]["burst"]:
            (plain / name).unlink()
        (plain / "manifest.json").write_text(json.dumps(stripped))
        reloaded = stub.ReloadModel(pb.ReloadModelRequest(name="no-burst"), timeout=DEADLINE_S)
        assert reloaded.name == "lightgbm" and list(reloaded.burst_choices) == []
        assert list(stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S).burst_choices) == []
    finally:
        channel.close()
        server.stop(grace_s=0.5)


def test_get_model_info_says_how_the_trees_are_evaluated(model_dir: Path, tmp_path: Path) -> None:
    """The model directory's compiled trees serve the forecast; a copy
    without them reloads and says it serves LightGBM's predict and why,
    with the same forecast (issue 22, item 4)."""
    server = _serve(PredictorConfig(port=0, window_s=900.0, model_dir=str(model_dir), model_root=str(tmp_path)))
    channel, stub = _stub(server)
    try:
        _feed(stub)
        request = pb.ForecastRequest(families=["bursty", "steady-a", "steady-b", "new"])
        compiled = stub.Forecast(request, timeout=DEADLINE_S)
        info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
        if compiled_trees.unavailable():
            assert info.inference.startswith("lightgbm predict (fallback: ")
            return
        assert info.inference.startswith("compiled trees (tl2cgen ")
        plain = shutil.copytree(model_dir, tmp_path / "plain")
        for library in plain.glob("*.so"):
            library.unlink()
        reloaded = stub.ReloadModel(pb.ReloadModelRequest(name=plain.name), timeout=DEADLINE_S)
        assert reloaded.inference.startswith("lightgbm predict (fallback: ") and "missing" in reloaded.inference
        assert stub.Forecast(request, timeout=DEADLINE_S).forecasts == compiled.forecasts
    finally:
        channel.close()
        server.stop(grace_s=0.5)


def test_service_survives_retraining_while_serving(tmp_path: Path) -> None:
    server = _serve(PredictorConfig(port=0, window_s=900.0, retrain_interval_s=0.2, retrain_quick=True,
                                    retrain_dir=str(tmp_path), workers=8))
    channel, stub = _stub(server)
    errors: list[BaseException] = []
    versions: set[str] = set()
    stop = threading.Event()

    def forecaster() -> None:
        while not stop.is_set():
            try:
                r = stub.Forecast(pb.ForecastRequest(families=["bursty", "steady-a"]), timeout=DEADLINE_S)
                versions.add(r.model_version)
                assert len(r.forecasts) == 2 and all(h.expected_count >= 0 for h in r.forecasts[0].horizons)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)
                return

    try:
        _feed(stub)
        thread = threading.Thread(target=forecaster)
        thread.start()
        deadline = time.monotonic() + 240.0
        swapped = 0
        while time.monotonic() < deadline and swapped < 2:
            info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
            swapped = len([d for d in tmp_path.iterdir() if (d / "manifest.json").is_file()])
            time.sleep(0.2)
        stop.set()
        thread.join(DEADLINE_S)
        assert not errors, errors[0]
        assert swapped >= 2, "two retrains swapped in"
        info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
        assert info.name == "lightgbm" and info.version.startswith("online-")
        assert info.source.startswith(str(tmp_path))
    finally:
        stop.set()
        channel.close()
        server.stop(grace_s=0.5)
