"""The predictor process: config, core, servicer, metrics, and a gRPC server."""
from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping

import grpc
from opentelemetry.metrics import Counter

from speckv.services.common.clock import Clock, SystemClock
from speckv.services.common.config import parse_config
from speckv.services.common.errors import SpeckvError
from speckv.services.common.rpc.server import ServiceServer, serve_until_signal
from speckv.services.common.rpc.service_metrics import register_gauges
from speckv.services.common.rpc.telemetry import Telemetry, build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.fitting.retrain import Retrainer, RetrainSettings
from speckv.services.predictor.fitting.returns.config import load_return_config
from speckv.services.predictor.fitting.returns.online import OnlineReturnFitter
from speckv.services.predictor.online_learning import OnlineLearning, served_models
from speckv.services.predictor.fitting.training import load_config
from speckv.services.predictor.servicer import PredictorServicer
from speckv.services.predictor.serving.core import BUILTIN_SOURCE, PredictorCore
from speckv.services.predictor.serving.manifest import load_model
from speckv.services.predictor.serving.returns.serving import ReturnsCore
from speckv.services.predictor.serving.served_models import ServedModelRecord
from speckv.v1 import predictor_pb2, predictor_pb2_grpc

SERVICE = "predictor"


def build_core(config: PredictorConfig, clock: Clock) -> PredictorCore:
    """The core with the model of config.model_dir, or the builtin EWMA."""
    if config.model_dir:
        try:
            model = load_model(config.model_dir)
        except SpeckvError as exc:  # its messages name files within the directory: say which directory
            raise type(exc)(f"model_dir={config.model_dir!r}: {exc}") from None
        return PredictorCore(clock, model, config.core_settings(), source=config.model_dir)
    return PredictorCore(clock, config.builtin_model(), config.core_settings(), source=BUILTIN_SOURCE)


def build_returns(config: PredictorConfig, clock: Clock) -> tuple[ReturnsCore, OnlineLearning | None]:
    """Session returns: the model of config.returns_model (none: every
    ForecastReturns is FAILED_PRECONDITION until online learning serves one),
    the tracker's caps from the committed `session_return` section, warmed
    with config.returns_warm; with config.online_learning, the learner that
    refits it from the traffic (the loaded model its warm start)."""
    section = load_return_config()
    settings = config.returns_settings(section.tracker, section.features.max_conversations)
    saved = None
    if config.returns_model:
        from speckv.services.predictor.serving.returns.store import load_return_model  # imports LightGBM

        saved = load_return_model(config.returns_model)
    fitter = None
    spec = saved.spec if saved is not None else section.features  # refits read the served model's features
    if config.online_learning:
        fitter = OnlineReturnFitter(replace(section, features=spec), section.online, clock,
                                    saved.model if saved is not None else None, saved.version if saved else "")
    returns = ReturnsCore(clock, settings, saved, sink=fitter)
    if config.returns_warm:
        from speckv.services.predictor.serving.returns.store import read_past_turns

        returns.warm(read_past_turns(config.returns_warm))
    if fitter is None:
        return returns, None
    recalibration = saved.recalibration if saved is not None else section.recalibration
    return returns, OnlineLearning(fitter, returns, spec, recalibration, config.online_check_s)


def build_retrainer(config: PredictorConfig, core: PredictorCore) -> Retrainer:
    training = load_config(quick=config.retrain_quick)
    training = replace(training, spec=replace(training.spec, step_s=config.step_s))
    settings = RetrainSettings(Path(config.retrain_dir), interval_s=config.retrain_interval_s,
                               min_arrivals=config.retrain_min_arrivals)
    return Retrainer(core, training, settings)


def build_server(config: PredictorConfig, telemetry: Telemetry, clock: Clock | None = None) -> ServiceServer:
    clock = clock or SystemClock()
    core = build_core(config, clock)
    returns, learning = build_returns(config, clock)
    retrainer = build_retrainer(config, core) if config.retrain_interval_s > 0 else None
    stopping = threading.Event()
    servicer = _CountingServicer(core, stopping, returns, _forecasts_counter(telemetry),
                                 lambda: served_models(core, returns, learning, retrainer))

    def register(server: grpc.Server) -> list[str]:
        predictor_pb2_grpc.add_PredictorServicer_to_server(servicer, server)
        return [predictor_pb2.DESCRIPTOR.services_by_name["Predictor"].full_name]

    server = ServiceServer(SERVICE, config, telemetry, register)
    server.on_stop(stopping.set)
    for worker in (retrainer, learning):
        if worker is not None:
            server.on_start(worker.start)
            server.on_stop(worker.stop)
    _register_metrics(telemetry, core, returns)
    return server


class _CountingServicer(PredictorServicer):
    """The servicer, counting the family forecasts each Forecast answer carries."""

    def __init__(self, core: PredictorCore, stopping: threading.Event, returns: ReturnsCore,
                 forecasts: Counter, served: Callable[[], list[ServedModelRecord]]) -> None:
        super().__init__(core, stopping, returns, served)
        self._forecasts = forecasts

    def Forecast(self, request: predictor_pb2.ForecastRequest,
                 context: grpc.ServicerContext) -> predictor_pb2.ForecastResponse:
        response = super().Forecast(request, context)
        for known, n in forecast_rows(response).items():
            if n:
                self._forecasts.add(n, {"known": known})
        return response


def forecast_rows(response: predictor_pb2.ForecastResponse) -> dict[str, int]:
    """Family rows of one answer: "true" where the model knew the family,
    "false" where its prior answered (a row holds every horizon asked)."""
    known = sum(1 for row in response.forecasts if row.known)
    return {"true": known, "false": len(response.forecasts) - known}


def _forecasts_counter(telemetry: Telemetry) -> Counter:
    return telemetry.meter_provider.get_meter(f"speckv.{SERVICE}").create_counter(
        "speckv.predictor.forecasts", unit="{forecast}",
        description="family forecasts served by Forecast, by whether the model knew the family")


def _register_metrics(telemetry: Telemetry, core: PredictorCore, returns: ReturnsCore) -> None:
    def observations():
        return [(float(n), {"outcome": name}) for name, n in core.counters().items()]

    register_gauges(telemetry.meter_provider, SERVICE, {
        "speckv.predictor.families_tracked": lambda: [(float(core.families_tracked), {})],
        "speckv.predictor.families_dropped": lambda: [(float(core.families_dropped), {})],
        "speckv.predictor.observations": observations,
        "speckv.predictor.open_conversations": lambda: [(float(returns.open_conversations), {})],
        "speckv.predictor.returns_events": lambda: [(float(n), {"kind": name})
                                                    for name, n in returns.counters().items()],
    })


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    config = parse_config(PredictorConfig, argv, environ, prog="speckv predictor")
    telemetry = build_telemetry(SERVICE, environ)
    return serve_until_signal(build_server(config, telemetry))
