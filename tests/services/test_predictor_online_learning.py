"""Online learning over gRPC (issue 45, item 1): a real predictor started
with --online-learning and no return model serves no return forecasts at a
cold start, learns one from the arrivals and turn ends it receives (its
worker thread fits once the committed thresholds are met), then answers
ForecastReturns with it, and GetModelInfo names each served model's version
and training window."""
from __future__ import annotations

import contextlib
from typing import Iterator

import grpc
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.rpc.server import open_channel
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.fitting.returns.config import load_return_config
from speckv.services.predictor.server import build_server
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc
from tests.support.returns_conversations import conversations
from tests.support.waiting import wait_until

START = 10_000.0
DEADLINE_S = 30.0
STEP_S = 20.0  # traffic is sent in batches of this many seconds, the clock moved to each batch's end


@contextlib.contextmanager
def predictor(clock: ManualClock, **overrides) -> Iterator[predictor_pb2_grpc.PredictorStub]:
    config = PredictorConfig(**{"port": 0, "grace_s": 1.0, "online_learning": True, "online_check_s": 0.05,
                                **overrides})
    config.validate()
    server = build_server(config, build_telemetry("predictor", {}), clock=clock).start()
    channel = open_channel(server.address, None)
    try:
        yield predictor_pb2_grpc.PredictorStub(channel)
    finally:
        channel.close()
        server.stop(grace_s=0.5)


def send_traffic(stub: predictor_pb2_grpc.PredictorStub, clock: ManualClock, since_s: float, until_s: float) -> int:
    """The synthetic conversations' arrivals (ObserveArrivals) and turn ends
    (ReportTurnEnds) in [since_s, until_s), batch by batch; returns turn ends sent."""
    events = []
    for r in conversations(n=900, duration_s=3600.0, seed=5):
        end = r.arrival_s + 25e-6 * r.prompt_tokens + 0.02 * r.output_tokens
        events.append((r.arrival_s, 0, r, end))
        events.append((end, 1, r, end))
    events.sort(key=lambda e: (e[0], e[1], e[2].family))
    i = next((k for k, e in enumerate(events) if e[0] >= since_s), len(events))
    sent, batch_end = 0, since_s + STEP_S
    while batch_end <= until_s:
        arrivals, ends = [], []
        while i < len(events) and events[i][0] < batch_end:
            t, kind, r, end = events[i]
            if kind == 0:
                arrivals.append(pb.Arrival(time_s=START + t, family=r.family, prompt_tokens=r.prompt_tokens))
            else:
                ends.append(pb.TurnEnd(conversation=r.family, arrival_s=START + r.arrival_s, end_s=START + end,
                                       prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens))
            i += 1
        clock.set(START + batch_end)
        if arrivals:
            assert stub.ObserveArrivals(iter(arrivals), timeout=DEADLINE_S).accepted == len(arrivals)
        if ends:
            stub.ReportTurnEnds(pb.TurnEndBatch(turn_ends=ends), timeout=DEADLINE_S)
            sent += len(ends)
        batch_end += STEP_S
    return sent


def served(stub: predictor_pb2_grpc.PredictorStub) -> dict[str, pb.ServedModel]:
    return {m.kind: m for m in stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S).served_models}


def test_a_cold_start_learns_a_return_model_from_its_traffic_and_serves_it():
    online = load_return_config().online
    clock = ManualClock(START)
    with predictor(clock) as stub:
        models = served(stub)
        assert set(models) == {"count"} and models["count"].origin == "builtin"
        with pytest.raises(grpc.RpcError) as cold:
            stub.ForecastReturns(pb.ForecastReturnsRequest(within_s=120.0), timeout=DEADLINE_S)
        assert cold.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        send_traffic(stub, clock, 0.0, online.min_history_s / 2)
        assert "return" not in served(stub)  # too little history yet
        sent = send_traffic(stub, clock, online.min_history_s / 2, 1800.0)
        assert sent >= online.min_turn_ends
        assert wait_until(lambda: "return" in served(stub), DEADLINE_S)
        model = served(stub)["return"]
        assert model.version.startswith("online-") and model.origin in ("online", "online baseline")
        assert model.online_learning and model.validation_metric.startswith("held-out Brier")
        assert START <= model.window_start_s < model.window_end_s <= model.fitted_at_s <= clock.now()
        assert model.training_rows >= online.min_turn_ends
        assert model.validation_score <= model.replaced_score
        answer = stub.ForecastReturns(pb.ForecastReturnsRequest(within_s=120.0), timeout=DEADLINE_S)
        assert answer.model == model.version and answer.open_conversations > 0
        assert all(0.0 <= r.probability <= 1.0 for r in answer.returns)


def test_without_online_learning_nothing_is_learned():
    clock = ManualClock(START)
    with predictor(clock, online_learning=False) as stub:
        send_traffic(stub, clock, 0.0, 1200.0)
        models = served(stub)
        assert set(models) == {"count"} and not models["count"].online_learning
        with pytest.raises(grpc.RpcError) as none:
            stub.ForecastReturns(pb.ForecastReturnsRequest(within_s=120.0), timeout=DEADLINE_S)
        assert none.value.code() is grpc.StatusCode.FAILED_PRECONDITION
