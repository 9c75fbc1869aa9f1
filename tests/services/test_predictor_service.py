"""The predictor's real gRPC server, in process, called through real stubs."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.rpc.server import ServiceServer, open_channel
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server
from speckv.services.predictor.serving.manifest import write_manifest
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc

NOW = 10_000.0
DEADLINE_S = 30.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The predictor's model root (ReloadModel loads names under it)."""
    (tmp_path / "models").mkdir()
    return tmp_path / "models"


@pytest.fixture
def server(clock: ManualClock, root: Path) -> Iterator[ServiceServer]:
    config = PredictorConfig(port=0, max_message_mb=1, grace_s=1.0, workers=8, model_root=str(root))
    config.validate()
    server = build_server(config, build_telemetry("predictor", {}), clock=clock).start()
    yield server
    server.stop(grace_s=0.5)


@pytest.fixture
def stub(server: ServiceServer) -> Iterator[predictor_pb2_grpc.PredictorStub]:
    channel = open_channel(server.address, None)
    yield predictor_pb2_grpc.PredictorStub(channel)
    channel.close()


def arrivals(family: str, rate: float, start: float, end: float) -> list[pb.Arrival]:
    return [pb.Arrival(time_s=float(t), family=family, node_id="n1", prompt_tokens=100, cached_tokens=50)
            for t in np.arange(start, end, 1.0 / rate)]


def observe(stub: predictor_pb2_grpc.PredictorStub, messages: list[pb.Arrival]) -> pb.ObserveSummary:
    return stub.ObserveArrivals(iter(messages), timeout=DEADLINE_S)


def test_observed_stream_shows_in_the_forecast(stub: predictor_pb2_grpc.PredictorStub) -> None:
    stream = sorted(arrivals("hot", 5.0, NOW - 120, NOW) + arrivals("cold", 0.5, NOW - 120, NOW),
                    key=lambda a: a.time_s)
    summary = observe(stub, stream)
    assert (summary.accepted, summary.rejected, summary.first_error) == (len(stream), 0, "")
    response = stub.Forecast(pb.ForecastRequest(families=["hot", "cold", "never"]), timeout=DEADLINE_S)
    assert response.model_version == "builtin-ewma" and response.now_s == NOW
    hot, cold, never = response.forecasts
    assert [f.family for f in response.forecasts] == ["hot", "cold", "never"]
    assert hot.known and cold.known and not never.known
    assert [h.horizon_s for h in hot.horizons] == [1.0, 2.0, 5.0, 10.0]
    assert hot.horizons[0].expected_count == pytest.approx(5.0, rel=0.1)
    assert cold.horizons[0].expected_count == pytest.approx(0.5, rel=0.1)
    assert never.horizons[0].expected_count == pytest.approx(2.75, rel=0.1)  # mean per-family rate
    assert all(h.upper_quantile >= h.expected_count - 1 for h in hot.horizons)
    top = stub.Forecast(pb.ForecastRequest(max_families=1, horizons_s=[3.0]), timeout=DEADLINE_S)
    assert [f.family for f in top.forecasts] == ["hot"]
    assert top.forecasts[0].horizons[0].expected_count == pytest.approx(15.0, rel=0.1)


def test_bad_observations_are_counted_not_fatal(stub: predictor_pb2_grpc.PredictorStub) -> None:
    stream = [pb.Arrival(time_s=NOW, family="a"), pb.Arrival(time_s=NOW, family=""),
              pb.Arrival(time_s=-3.0, family="b"), pb.Arrival(time_s=NOW, family="c")]
    summary = observe(stub, stream)
    assert (summary.accepted, summary.rejected) == (2, 2)
    assert "family is empty" in summary.first_error
    info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
    assert (info.families_tracked, info.observations_total) == (2, 2)


@pytest.mark.parametrize("request_", [
    pb.ForecastRequest(families=["a"], horizons_s=[0.0]),
    pb.ForecastRequest(families=["a"], horizons_s=[1.0, -2.0]),
    pb.ForecastRequest(families=["a"], horizons_s=[1e9]),
    pb.ForecastRequest(families=["a", ""]),
    pb.ForecastRequest(families=["a"], now_s=-5.0),
])
def test_malformed_forecasts_are_invalid_argument(stub: predictor_pb2_grpc.PredictorStub,
                                                  request_: pb.ForecastRequest) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Forecast(request_, timeout=DEADLINE_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details()


def test_model_info_describes_the_builtin_model(stub: predictor_pb2_grpc.PredictorStub) -> None:
    info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S)
    assert (info.name, info.version, info.source) == ("ewma", "builtin-ewma", "builtin")
    assert list(info.horizons_s) == [1.0, 2.0, 5.0, 10.0] and info.quantile == pytest.approx(0.9)
    assert info.loaded_at_s == NOW and "burst" in info.burst_definition and info.features
    assert not info.burst_choices  # no burst classifier: the count distribution serves every horizon


def test_reload(stub: predictor_pb2_grpc.PredictorStub, root: Path) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReloadModel(pb.ReloadModelRequest(name="absent"), timeout=DEADLINE_S)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    write_manifest(root / "bad", {"kind": "ewma", "version": "v2", "horizons_s": [1], "quantile": 0.9,
                                  "halflife": 3})
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReloadModel(pb.ReloadModelRequest(name="bad"), timeout=DEADLINE_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "halflife" in caught.value.details()
    assert stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S).version == "builtin-ewma"
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReloadModel(pb.ReloadModelRequest(name=""), timeout=DEADLINE_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    write_manifest(root / "good", {"kind": "ewma", "version": "v2", "horizons_s": [2, 4], "quantile": 0.5,
                                   "halflife_s": 5, "metrics": {"mae_2s": 1.5}})
    with pytest.raises(grpc.RpcError) as caught:  # a path, even to a good model under the root, is refused
        stub.ReloadModel(pb.ReloadModelRequest(path=str(root / "good")), timeout=DEADLINE_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "name" in caught.value.details()
    info = stub.ReloadModel(pb.ReloadModelRequest(name="good"), timeout=DEADLINE_S)
    assert (info.version, list(info.horizons_s), dict(info.metrics)) == ("v2", [2.0, 4.0], {"mae_2s": 1.5})
    assert info.source == os.path.realpath(root / "good")
    response = stub.Forecast(pb.ForecastRequest(families=["x"]), timeout=DEADLINE_S)
    assert response.model_version == "v2" and [h.horizon_s for h in response.forecasts[0].horizons] == [2.0, 4.0]


def test_reload_without_a_model_root_is_a_failed_precondition(clock: ManualClock) -> None:
    config = PredictorConfig(port=0, grace_s=1.0)
    config.validate()
    server = build_server(config, build_telemetry("predictor", {}), clock=clock).start()
    channel = open_channel(server.address, None)
    try:
        stub = predictor_pb2_grpc.PredictorStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ReloadModel(pb.ReloadModelRequest(name="v2"), timeout=DEADLINE_S)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no model root" in caught.value.details()
    finally:
        channel.close()
        server.stop(grace_s=0.5)


def test_oversize_message_is_resource_exhausted(stub: predictor_pb2_grpc.PredictorStub) -> None:
    families = [f"{i:08d}" + "x" * 1000 for i in range(1500)]  # ~1.5 MiB, over the 1 MiB limit
    with pytest.raises(grpc.RpcError) as caught:
        stub.Forecast(pb.ForecastRequest(families=families), timeout=DEADLINE_S)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_stopping_the_server_ends_an_open_observe_stream(server: ServiceServer,
                                                         stub: predictor_pb2_grpc.PredictorStub) -> None:
    sent_first = threading.Event()
    release = threading.Event()

    def slow_stream() -> Iterator[pb.Arrival]:
        yield pb.Arrival(time_s=NOW, family="a")
        sent_first.set()
        release.wait(DEADLINE_S)
        yield pb.Arrival(time_s=NOW, family="a")

    call = stub.ObserveArrivals.future(slow_stream(), timeout=DEADLINE_S)
    assert sent_first.wait(DEADLINE_S)
    server.stop(grace_s=0.5)
    release.set()
    try:
        summary = call.result(timeout=DEADLINE_S)
        assert summary.accepted >= 1
    except grpc.RpcError as exc:  # cut off by the shutdown grace period
        assert exc.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
