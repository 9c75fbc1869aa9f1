"""Route reports arrivals to a real predictor, batched and off the request
path; with the predictor down, Route still answers."""
import contextlib

import grpc

from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server as build_predictor
from speckv.v1 import predictor_pb2, predictor_pb2_grpc, scheduler_pb2
from tests.support.scheduler_service import register, scheduler
from tests.support.waiting import TIMEOUT, wait_until


@contextlib.contextmanager
def predictor():
    server = build_predictor(PredictorConfig(), build_telemetry("predictor", {})).start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield server, predictor_pb2_grpc.PredictorStub(channel)
    finally:
        channel.close()
        server.stop(grace_s=1.0)


def route(stub, family, n):
    for i in range(n):
        stub.Route(scheduler_pb2.RouteRequest(request_id=f"r{i}", block_hashes=[7, 8], prompt_tokens=40,
                                              family=family), timeout=TIMEOUT)


def test_routes_reach_the_predictor_as_arrivals():
    with predictor() as (pred_server, pred), scheduler(predictor=pred_server.address) as (_, sched):
        register(sched, "n1", "127.0.0.1:1", block_size=4)
        route(sched, "chat", 12)

        def observed():
            return pred.GetModelInfo(predictor_pb2.ModelInfoRequest(), timeout=TIMEOUT).observations_total
        assert wait_until(lambda: observed() == 12)
        forecast = pred.Forecast(predictor_pb2.ForecastRequest(families=["chat"]), timeout=TIMEOUT)
        assert forecast.forecasts[0].known


def test_route_works_while_the_predictor_is_down():
    # a port nothing listens on: every batch fails and is dropped, Route is unaffected
    with scheduler(predictor="127.0.0.1:1") as (_, sched):
        register(sched, "n1", "127.0.0.1:2", block_size=4)
        route(sched, "chat", 5)
        state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
        assert state.nodes[0].routes_total == 5
