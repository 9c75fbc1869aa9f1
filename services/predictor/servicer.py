"""gRPC face of the predictor: unpack, call the core, pack. No logic here."""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import grpc

from speckv.services.common.errors import SpeckvError
from speckv.services.common.rpc import authz
from speckv.services.predictor.serving.core import ForecastResult, ModelInfoRecord, PredictorCore
from speckv.services.predictor.serving.model_reload import reload_model
from speckv.services.predictor.serving.model_root import refuse_path
from speckv.services.predictor.serving.observations import Arrival, ObserveResult
from speckv.services.predictor.serving.returns.serving import ReturnsAnswer, ReturnsCore, TurnEndRecord, TurnEndResult
from speckv.services.predictor.serving.selection import Choice
from speckv.services.predictor.serving.served_models import ServedModelRecord
from speckv.v1 import predictor_pb2, predictor_pb2_grpc

if TYPE_CHECKING:
    from speckv.services.predictor.serving.burst_choice import HorizonBurstChoice

log = logging.getLogger(__name__)


class PredictorServicer(predictor_pb2_grpc.PredictorServicer):
    def __init__(self, core: PredictorCore, stopping: threading.Event, returns: ReturnsCore,
                 served_models: Callable[[], Sequence[ServedModelRecord]] | None = None) -> None:
        self._core = core
        self._stopping = stopping
        self._returns = returns
        self._served_models = served_models or (lambda: ())

    def _info(self, info: ModelInfoRecord) -> predictor_pb2.ModelInfo:
        out = model_info_to_proto(info)
        out.served_models.extend(served_model_to_proto(r) for r in self._served_models())
        return out

    def ObserveArrivals(self, request_iterator: Iterator[predictor_pb2.Arrival],
                        context: grpc.ServicerContext) -> predictor_pb2.ObserveSummary:
        # Each message is counted as it arrives (forecasts see it at once).
        # When the server stops, the stream is answered after the next message;
        # a client that stays silent is cut off by the server's grace period.
        total = ObserveResult()
        for message in request_iterator:
            arrival = (arrival_from_proto(message),)
            total.merge(self._core.observe(arrival))
            self._returns.observe(arrival)  # conversation = family; it skips what the count core rejects
            if self._stopping.is_set():
                break
        return predictor_pb2.ObserveSummary(accepted=total.accepted, rejected=total.rejected,
                                            first_error=total.first_error)

    def Forecast(self, request: predictor_pb2.ForecastRequest,
                 context: grpc.ServicerContext) -> predictor_pb2.ForecastResponse:
        result = self._core.forecast(
            list(request.families), list(request.horizons_s),
            now_s=request.now_s if request.now_s else None, max_families=request.max_families)
        return forecast_to_proto(result)

    def GetModelInfo(self, request: predictor_pb2.ModelInfoRequest,
                     context: grpc.ServicerContext) -> predictor_pb2.ModelInfo:
        return self._info(self._core.model_info())

    def ReloadModel(self, request: predictor_pb2.ReloadModelRequest,
                    context: grpc.ServicerContext) -> predictor_pb2.ModelInfo:
        authz.require_admin(context, "ReloadModel")  # it runs a candidate's code (in the probe process)
        refuse_path(request.path)
        try:
            info = reload_model(self._core, request.name)
        except SpeckvError as exc:
            # the caller reads the model's name; the server's log keeps its paths (the cause, where rewritten)
            log.warning("ReloadModel %r (model root %s) refused: %s", request.name,
                        self._core.settings.model_root, exc.__cause__ or exc)
            raise
        return self._info(info)

    def ReportTurnEnds(self, request: predictor_pb2.TurnEndBatch,
                       context: grpc.ServicerContext) -> predictor_pb2.TurnEndAck:
        return turn_end_ack_to_proto(self._returns.report([turn_end_from_proto(t) for t in request.turn_ends]))

    def ForecastReturns(self, request: predictor_pb2.ForecastReturnsRequest,
                        context: grpc.ServicerContext) -> predictor_pb2.ForecastReturnsResponse:
        answer = self._returns.forecast(request.within_s, now_s=request.now_s if request.now_s else None,
                                        max_conversations=request.max_conversations,
                                        min_probability=request.min_probability)
        return returns_to_proto(answer)


def turn_end_from_proto(message: predictor_pb2.TurnEnd) -> TurnEndRecord:
    return TurnEndRecord(message.conversation, message.arrival_s, message.end_s, message.prompt_tokens,
                         message.output_tokens, message.follow_ups)


def turn_end_ack_to_proto(result: TurnEndResult) -> predictor_pb2.TurnEndAck:
    return predictor_pb2.TurnEndAck(accepted=result.accepted, opened=result.opened,
                                    open_conversations=result.open_conversations, model=result.model)


def returns_to_proto(answer: ReturnsAnswer) -> predictor_pb2.ForecastReturnsResponse:
    Row = predictor_pb2.ConversationReturn
    return predictor_pb2.ForecastReturnsResponse(
        returns=[Row(conversation=c, probability=p) for c, p in zip(answer.conversations,
                                                                    answer.probabilities.tolist())],
        model=answer.model, now_s=answer.now_s, open_conversations=answer.open_conversations)


def arrival_from_proto(message: predictor_pb2.Arrival) -> Arrival:
    return Arrival(time_s=message.time_s, family=message.family, node_id=message.node_id,
                   prompt_tokens=message.prompt_tokens, cached_tokens=message.cached_tokens)


def forecast_to_proto(result: ForecastResult) -> predictor_pb2.ForecastResponse:
    horizons = result.horizons_s.tolist()
    expected, upper, burst = result.expected.tolist(), result.upper.tolist(), result.burst_probability.tolist()
    known = result.known.tolist()
    HorizonForecast, FamilyForecast = predictor_pb2.HorizonForecast, predictor_pb2.FamilyForecast
    forecasts = [
        FamilyForecast(family=family, known=known[i], horizons=[
            HorizonForecast(horizon_s=h, expected_count=expected[i][j], upper_quantile=upper[i][j],
                            burst_probability=burst[i][j])
            for j, h in enumerate(horizons)])
        for i, family in enumerate(result.families)
    ]
    return predictor_pb2.ForecastResponse(forecasts=forecasts, model_version=result.model_version,
                                          now_s=result.now_s)


def model_info_to_proto(info: ModelInfoRecord) -> predictor_pb2.ModelInfo:
    return predictor_pb2.ModelInfo(
        name=info.name, version=info.version, horizons_s=list(info.horizons_s), quantile=info.quantile,
        features=list(info.features), metrics=info.metrics, source=info.source, loaded_at_s=info.loaded_at_s,
        families_tracked=info.families_tracked, observations_total=info.observations_total,
        burst_definition=info.burst_definition, choices=[choice_to_proto(c) for c in info.choices],
        family_classes=info.family_classes, inference=info.inference,
        burst_choices=[burst_choice_to_proto(b) for b in info.burst_choices])


def served_model_to_proto(record: ServedModelRecord) -> predictor_pb2.ServedModel:
    return predictor_pb2.ServedModel(
        kind=record.kind, version=record.version, origin=record.origin, window_start_s=record.window_start_s,
        window_end_s=record.window_end_s, fitted_at_s=record.fitted_at_s, training_rows=record.training_rows,
        validation_metric=record.validation_metric, validation_score=record.validation_score,
        replaced_score=record.replaced_score, online_learning=record.online_learning)


def burst_choice_to_proto(choice: HorizonBurstChoice) -> predictor_pb2.BurstChoice:
    return predictor_pb2.BurstChoice(
        horizon_s=choice.horizon_s, chosen=choice.chosen, alarm_threshold=choice.alarm_threshold,
        validation_bursts=choice.episodes,
        candidates=[predictor_pb2.BurstSourceScore(source=s.source, f1=s.f1, precision=s.precision, recall=s.recall,
                                                   lead_s=s.lead_s, threshold=s.threshold) for s in choice.scores])


def choice_to_proto(choice: Choice) -> predictor_pb2.ForecastChoice:
    return predictor_pb2.ForecastChoice(
        horizon_s=choice.horizon_s, family_class=choice.family_class, chosen=choice.chosen,
        weights=[predictor_pb2.CandidateWeight(forecaster=n, weight=w) for n, w in choice.weights],
        candidates=[predictor_pb2.CandidateScore(forecaster=n, validation_mae=v) for n, v in choice.validation_mae],
        validation_rows=choice.rows, inherited=choice.inherited)
