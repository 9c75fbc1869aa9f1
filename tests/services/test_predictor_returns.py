"""Session returns over gRPC: a real predictor with a saved return model,
fed arrivals (ObserveArrivals) and turn ends (ReportTurnEnds) through real
stubs, answers ForecastReturns as its tracker would; bad turn ends are
INVALID_ARGUMENT and change nothing; no model is FAILED_PRECONDITION; the
router's TurnEndReporter delivers and survives a predictor that is down."""
from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.config import parse_config
from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.common.rpc.server import ServiceServer, open_channel
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server
from speckv.services.predictor.serving.returns.store import PastTurn, write_past_turns
from speckv.services.predictor.serving.returns.tracker import ReturnTracker
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc
from tests.support.returns_model import CONFIG, VERSION, save_synthetic_model, synthetic_model
from tests.support.waiting import wait_until

NOW = 20_000.0
DEADLINE_S = 30.0
# (conversation, [(arrival, end, prompt, output), ...]) seconds before NOW: engaged and idle conversations
CONVERSATIONS = [
    ("long-talk", [(-200.0, -190.0, 9_000, 300), (-150.0, -141.0, 9_600, 250), (-100.0, -92.0, 10_200, 280)]),
    ("one-shot", [(-250.0, -247.0, 800, 60)]),
    ("fresh", [(-20.0, -12.0, 4_000, 200)]),
    ("middling", [(-400.0, -395.0, 2_000, 100), (-120.0, -115.0, 2_300, 90)]),
    ("came-back", [(-300.0, -296.0, 1_500, 80), (-30.0, -25.0, 1_900, 70), (-5.0, None, 2_100, 0)]),
]


@pytest.fixture(scope="module")
def returns_dir(tmp_path_factory) -> Path:
    return save_synthetic_model(tmp_path_factory.mktemp("returns") / "model")


@contextlib.contextmanager
def predictor(clock: ManualClock, **overrides) -> Iterator[tuple[ServiceServer, predictor_pb2_grpc.PredictorStub]]:
    config = PredictorConfig(**{"port": 0, "grace_s": 1.0, **overrides})
    config.validate()
    server = build_server(config, build_telemetry("predictor", {}), clock=clock).start()
    channel = open_channel(server.address, None)
    try:
        yield server, predictor_pb2_grpc.PredictorStub(channel)
    finally:
        channel.close()
        server.stop(grace_s=0.5)


def feed(stub: predictor_pb2_grpc.PredictorStub, clock: ManualClock, tracker: ReturnTracker | None = None) -> None:
    """Every conversation's turns, in time order: arrivals through
    ObserveArrivals as the scheduler reports them (a few ms after the
    router's arrival time), turn ends through ReportTurnEnds as the router
    reports them (its own arrival time); the same events to tracker, if given."""
    events = []
    for name, turns in CONVERSATIONS:
        for arrival, end, prompt, output in turns:
            events.append((NOW + arrival, 0, name, arrival, prompt, output))
            if end is not None:
                events.append((NOW + end, 1, name, arrival, prompt, output))
    for t, kind, name, arrival, prompt, output in sorted(events):
        clock.set(max(t, clock.now()))
        if kind == 0:
            stamp = NOW + arrival + 0.004
            summary = stub.ObserveArrivals(iter([pb.Arrival(time_s=stamp, family=name, prompt_tokens=prompt)]),
                                           timeout=DEADLINE_S)
            assert summary.accepted == 1
            if tracker is not None:
                tracker.arrival(name, stamp, prompt)
        else:
            ack = stub.ReportTurnEnds(pb.TurnEndBatch(turn_ends=[pb.TurnEnd(
                conversation=name, arrival_s=NOW + arrival, end_s=t, prompt_tokens=prompt, output_tokens=output)]),
                timeout=DEADLINE_S)
            assert ack.accepted == 1 and ack.model == VERSION
            if tracker is not None:
                tracker.turn_end(name, t, NOW + arrival + 0.004, prompt, output)
    clock.set(NOW)


def forecast(stub, within_s: float, **kwargs) -> pb.ForecastReturnsResponse:
    return stub.ForecastReturns(pb.ForecastReturnsRequest(within_s=within_s, **kwargs), timeout=DEADLINE_S)


def rows(reply: pb.ForecastReturnsResponse) -> list[tuple[str, float]]:
    return [(r.conversation, r.probability) for r in reply.returns]


def test_forecast_returns_after_arrivals_and_turn_ends_likeliest_first(returns_dir):
    clock = ManualClock(NOW - 1_000.0)
    tracker = ReturnTracker(synthetic_model(), CONFIG.features)
    with predictor(clock, returns_model=str(returns_dir)) as (_, stub):
        feed(stub, clock, tracker)
        reply = forecast(stub, 120.0)
        assert reply.model == VERSION and reply.now_s == NOW and reply.open_conversations == 4
        names, p = tracker.p_within(NOW, 120.0)
        expected = sorted(zip(names, p.tolist()), key=lambda row: -row[1])
        assert rows(reply) == expected
        assert "came-back" not in names  # its next turn arrived: not open
        probabilities = [q for _, q in rows(reply)]
        assert probabilities == sorted(probabilities, reverse=True) and len(set(probabilities)) == 4
        # within_s: a longer window is likelier for every conversation
        longer = dict(rows(forecast(stub, 600.0)))
        assert all(longer[name] > q for name, q in rows(reply))
        # min_probability and max_conversations
        cut = float(np.median(p))
        assert rows(forecast(stub, 120.0, min_probability=cut)) == [(n, q) for n, q in expected if q >= cut]
        assert rows(forecast(stub, 120.0, max_conversations=2)) == expected[:2]
        assert forecast(stub, 120.0, min_probability=1.0).returns == []
        # now_s: later, longer idle, as the tracker says
        later = forecast(stub, 120.0, now_s=NOW + 60.0)
        assert later.now_s == NOW + 60.0
        assert dict(rows(later)) == pytest.approx(dict(zip(*tracker.p_within(NOW + 60.0, 120.0))))


@pytest.mark.parametrize("turn_end, message", [
    ({"conversation": "", "arrival_s": NOW - 5, "end_s": NOW}, "conversation is empty"),
    ({"conversation": "x", "arrival_s": NOW, "end_s": NOW - 5}, "before arrival_s"),
    ({"conversation": "x", "arrival_s": math.nan, "end_s": NOW}, "arrival_s"),
    ({"conversation": "x", "arrival_s": NOW - 5, "end_s": math.inf}, "end_s"),
    ({"conversation": "x", "arrival_s": NOW - 5, "end_s": NOW + 400}, "max_clock_skew_s"),
    ({"conversation": "x", "arrival_s": 1.0, "end_s": 2.0}, "max_clock_skew_s"),
    ({"conversation": "x", "arrival_s": NOW - 5, "end_s": NOW, "follow_ups": 70_000}, "follow_ups"),
])
def test_bad_turn_ends_are_invalid_argument_and_change_nothing(returns_dir, turn_end, message):
    clock = ManualClock(NOW - 1_000.0)
    with predictor(clock, returns_model=str(returns_dir)) as (_, stub):
        feed(stub, clock)
        before = forecast(stub, 300.0)
        good = pb.TurnEnd(conversation="newcomer", arrival_s=NOW - 8.0, end_s=NOW - 1.0, prompt_tokens=500,
                          output_tokens=40)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ReportTurnEnds(pb.TurnEndBatch(turn_ends=[good, pb.TurnEnd(**turn_end)]), timeout=DEADLINE_S)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details()
        assert "turn_ends[1]" in caught.value.details()
        assert forecast(stub, 300.0) == before  # the good one was not applied either


def test_forecast_arguments_are_checked(returns_dir):
    clock = ManualClock(NOW)
    with predictor(clock, returns_model=str(returns_dir)) as (_, stub):
        for request in (pb.ForecastReturnsRequest(within_s=0.0), pb.ForecastReturnsRequest(within_s=-1.0),
                        pb.ForecastReturnsRequest(within_s=1e9),
                        pb.ForecastReturnsRequest(within_s=30.0, min_probability=2.0),
                        pb.ForecastReturnsRequest(within_s=30.0, now_s=NOW + 1_000.0)):
            with pytest.raises(grpc.RpcError) as caught:
                stub.ForecastReturns(request, timeout=DEADLINE_S)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_without_a_return_model_forecasts_are_failed_precondition_and_turn_ends_are_dropped():
    clock = ManualClock(NOW)
    with predictor(clock) as (_, stub):
        with pytest.raises(grpc.RpcError) as caught:
            forecast(stub, 15.0)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--returns-model" in caught.value.details()
        ack = stub.ReportTurnEnds(pb.TurnEndBatch(turn_ends=[pb.TurnEnd(
            conversation="c", arrival_s=NOW - 5, end_s=NOW, prompt_tokens=10, output_tokens=5)]), timeout=DEADLINE_S)
        assert (ack.accepted, ack.model) == (0, "")
        with pytest.raises(grpc.RpcError) as caught:  # still validated
            stub.ReportTurnEnds(pb.TurnEndBatch(turn_ends=[pb.TurnEnd(conversation="c", arrival_s=NOW,
                                                                      end_s=NOW - 5)]), timeout=DEADLINE_S)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # arrivals still reach the count model
        stub.ObserveArrivals(iter([pb.Arrival(time_s=NOW, family="c")]), timeout=DEADLINE_S)
        assert stub.GetModelInfo(pb.ModelInfoRequest(), timeout=DEADLINE_S).observations_total == 1


def test_a_warm_file_fills_the_tracker_at_start(returns_dir, tmp_path):
    turns = [PastTurn(name, NOW + a, None if e is None else NOW + e, p, o)
             for name, history in CONVERSATIONS for a, e, p, o in history]
    warm = write_past_turns(tmp_path / "warm.jsonl", turns)
    clock = ManualClock(NOW)
    tracker = ReturnTracker(synthetic_model(), CONFIG.features)
    events = sorted([(t.arrival_s, 0, i) for i, t in enumerate(turns)]
                    + [(t.end_s, 1, i) for i, t in enumerate(turns) if t.end_s is not None])
    for time_s, kind, i in events:
        t = turns[i]
        if kind == 0:
            tracker.arrival(t.conversation, time_s, t.prompt_tokens)
        else:
            tracker.turn_end(t.conversation, time_s, t.arrival_s, t.prompt_tokens, t.output_tokens)
    with predictor(clock, returns_model=str(returns_dir), returns_warm=str(warm)) as (_, stub):
        assert dict(rows(forecast(stub, 300.0))) == dict(zip(*tracker.p_within(NOW, 300.0)))
        # the scheduler reporting those arrivals again (the e2e warm start routes them) changes nothing
        again = [pb.Arrival(time_s=t.arrival_s, family=t.conversation, prompt_tokens=t.prompt_tokens)
                 for t in turns if t.arrival_s >= NOW - 200.0]
        stub.ObserveArrivals(iter(again), timeout=DEADLINE_S)
        assert dict(rows(forecast(stub, 300.0))) == dict(zip(*tracker.p_within(NOW, 300.0)))


def test_a_malformed_model_or_warm_file_stops_the_predictor_from_starting(returns_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text('{"kind": "session-returns"}')
    with pytest.raises(InvalidArgument):
        build_server(PredictorConfig(port=0, returns_model=str(broken)), build_telemetry("predictor", {}))
    with pytest.raises(FailedPrecondition):
        build_server(PredictorConfig(port=0, returns_model=str(tmp_path / "absent")), build_telemetry("predictor", {}))
    (tmp_path / "warm.jsonl").write_text("not json\n")
    with pytest.raises(InvalidArgument, match="warm.jsonl:1"):
        build_server(PredictorConfig(port=0, returns_model=str(returns_dir), returns_warm=str(tmp_path / "warm.jsonl")),
                     build_telemetry("predictor", {}))
    with pytest.raises(InvalidArgument, match="returns_warm"):
        PredictorConfig(returns_warm="x").validate()


def test_the_flags_and_variables_name_the_model():
    config = parse_config(PredictorConfig, ["--returns-model", "/m", "--returns-warm", "/w.jsonl"], {},
                          prog="predictor")
    assert (config.returns_model, config.returns_warm) == ("/m", "/w.jsonl")
    config = parse_config(PredictorConfig, [], {"SPECKV_RETURNS_MODEL": "/m2"}, prog="predictor")
    assert config.returns_model == "/m2"


def test_the_routers_turn_end_reporter_delivers_in_batches_and_survives_an_outage(returns_dir):
    from speckv.services.client.reports import TurnEndReporter

    clock = ManualClock(NOW)
    with predictor(clock, returns_model=str(returns_dir)) as (server, stub):
        channel = grpc.insecure_channel(server.address)
        try:
            # trace seconds 0.. mapped onto the predictor's clock from NOW - 100
            reporter = TurnEndReporter(channel, lambda trace_s: NOW - 100.0 + trace_s, batch_max=3, flush_s=0.05)
            for i in range(7):
                reporter.offer(f"c{i}", float(i), float(i) + 6.0, 1_000 + i, 50)
            assert wait_until(lambda: reporter.stats().sent == 7)
            reporter.close()
            stats = reporter.stats()
            assert (stats.offered, stats.sent, stats.failed, stats.dropped) == (7, 7, 0, 0) and stats.batches >= 3
            assert forecast(stub, 300.0).open_conversations == 7
        finally:
            channel.close()
    down = grpc.insecure_channel("127.0.0.1:1")  # nothing listens: every batch fails, counted, never raised
    try:
        reporter = TurnEndReporter(down, lambda trace_s: trace_s, flush_s=0.01, timeout_s=0.5)
        reporter.offer("c", 1.0, 2.0, 10, 1)
        assert wait_until(lambda: reporter.stats().failed == 1)
        reporter.close()
        reporter.offer("late", 3.0, 4.0, 10, 1)
        assert reporter.stats().dropped == 1
    finally:
        down.close()
