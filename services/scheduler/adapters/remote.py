"""gRPC clients the scheduler core uses through small interfaces: prefix
confirmation against a node's kvstore (KVStore.Lookup), arrival reports to
the predictor (Predictor.ObserveArrivals) and forecasts from it: family
bursts (Predictor.Forecast) and session returns (Predictor.ForecastReturns),
ForecastSources combined by PredictorForecastSources. Every call carries a deadline.
Channels are instrumented, so a Route's Lookup joins the Route's trace."""
from __future__ import annotations

import logging
import threading
from typing import Sequence

import grpc

from speckv.services.common.ids import Family
from speckv.services.common.rpc.server import open_channel
from speckv.services.common.rpc.telemetry import Telemetry
from speckv.services.common.rpc.tls import TlsMaterial
from speckv.services.scheduler.arrival_reports import ArrivalRecord
from speckv.services.scheduler.forecasts import CombinedForecasts, Forecast, ForecastKind
from speckv.services.scheduler.policy_config import PolicyConfig
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc, predictor_pb2, predictor_pb2_grpc

log = logging.getLogger(__name__)


class KVStoreConfirmer:
    """Confirms a cached prefix with the node itself. One channel per address."""

    def __init__(self, telemetry: Telemetry | None, timeout_s: float, tls: TlsMaterial | None = None) -> None:
        self._telemetry = telemetry
        self._tls = tls
        self._timeout_s = timeout_s
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def asks(self, address: str) -> bool:
        return True

    def confirm(self, address: str, block_hashes: Sequence[int]) -> int | None:
        """Blocks of the longest prefix present on address; None if it did not answer."""
        stub = kvstore_pb2_grpc.KVStoreStub(self._channel(address))
        try:
            reply = stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=list(block_hashes)),
                                timeout=self._timeout_s)
        except grpc.RpcError as exc:
            log.debug("Lookup on %s failed: %s", address, exc.code() if hasattr(exc, "code") else exc)
            return None
        return int(reply.prefix_blocks)

    def forget(self, address: str) -> None:
        with self._lock:
            channel = self._channels.pop(address, None)
        if channel is not None:
            channel.close()

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = open_channel(address, self._telemetry, tls=self._tls,
                                                                 peer_role="kvstore")
            return channel


class PredictorSender:
    """Sends one batch of arrivals per ObserveArrivals call."""

    def __init__(self, address: str, telemetry: Telemetry | None, timeout_s: float = 2.0,
                 tls: TlsMaterial | None = None) -> None:
        self._channel = open_channel(address, telemetry, tls=tls, peer_role="predictor")
        self._stub = predictor_pb2_grpc.PredictorStub(self._channel)
        self._timeout_s = timeout_s
        self.rejected_total = 0

    def send(self, batch: list[ArrivalRecord]) -> None:
        messages = [predictor_pb2.Arrival(time_s=a.time_s, family=a.family, node_id=a.node_id,
                                          prompt_tokens=a.prompt_tokens, cached_tokens=a.cached_tokens)
                    for a in batch]
        summary = self._stub.ObserveArrivals(iter(messages), timeout=self._timeout_s)
        if summary.rejected:
            self.rejected_total += summary.rejected
            log.debug("predictor rejected %d arrivals: %s", summary.rejected, summary.first_error)

    def close(self) -> None:
        self._channel.close()


class PredictorForecasts:
    """ForecastSource over Predictor.Forecast. An unreachable predictor
    yields [] (logged once per outage): no forecast, no speculation."""

    def __init__(self, address: str, telemetry: Telemetry | None, timeout_s: float = 1.0,
                 tls: TlsMaterial | None = None) -> None:
        self._channel = open_channel(address, telemetry, tls=tls, peer_role="predictor")
        self._stub = predictor_pb2_grpc.PredictorStub(self._channel)
        self._timeout_s = timeout_s
        self._failing = False

    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        request = predictor_pb2.ForecastRequest(horizons_s=[horizon_s], now_s=now, max_families=max_families)
        try:
            reply = self._stub.Forecast(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            if not self._failing:
                log.warning("predictor Forecast failed (planning nothing until it answers): %s",
                            exc.code() if hasattr(exc, "code") else exc)
            self._failing = True
            return []
        if self._failing:
            log.info("predictor Forecast answers again")
        self._failing = False
        out = []
        for family in reply.forecasts:
            for h in family.horizons:
                if abs(h.horizon_s - horizon_s) < 1e-9:
                    out.append(Forecast(Family(family.family), h.horizon_s, h.expected_count,
                                        h.upper_quantile, h.burst_probability))
        return out

    def close(self) -> None:
        self._channel.close()


class PredictorReturnForecasts:
    """ForecastSource over Predictor.ForecastReturns: the session-return
    forecasts the simulator's ReturnForecasts gives (loadgen/sim/returns.py).
    Each call asks twice: within the replica lease (RETURN forecasts, the
    caller's max_families, at least planner.min_return_probability) and,
    when retain is enabled, within retain.ttl_s (RETENTION forecasts, at most
    retain.max_families, at least retain.min_probability); count = P(the
    conversation's next turn within that window | not back yet).

    A predictor with no return model answers FAILED_PRECONDITION: that is
    [] (the planner plans on family bursts alone), logged once at INFO; any
    other error is [] too, logged once per outage."""

    def __init__(self, address: str, telemetry: Telemetry | None, policy: PolicyConfig,
                 timeout_s: float = 1.0, tls: TlsMaterial | None = None) -> None:
        self._channel = open_channel(address, telemetry, tls=tls, peer_role="predictor")
        self._stub = predictor_pb2_grpc.PredictorStub(self._channel)
        self._timeout_s = timeout_s
        self._lease_s = policy.leases.replica_lease_ms / 1e3
        self._min_return = policy.planner.min_return_probability
        self._retain = policy.retain
        self._failing: grpc.StatusCode | None = None

    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        out = self._ask(now, self._lease_s, max_families, self._min_return, ForecastKind.RETURN)
        if self._failing is None and self._retain.enabled:  # no model, or down: the second call would fail too
            out += self._ask(now, self._retain.ttl_s, self._retain.max_families, self._retain.min_probability,
                             ForecastKind.RETENTION)
        return out

    def _ask(self, now: float, within_s: float, limit: int, min_p: float, kind: ForecastKind) -> list[Forecast]:
        request = predictor_pb2.ForecastReturnsRequest(now_s=now, within_s=within_s, max_conversations=limit,
                                                       min_probability=min_p)
        try:
            reply = self._stub.ForecastReturns(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            if code != self._failing:
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    log.info("predictor serves no session-return model: planning on family bursts alone")
                else:
                    log.warning("predictor ForecastReturns failed (no return forecasts until it answers): %s", code)
            self._failing = code
            return []
        if self._failing is not None:
            log.info("predictor ForecastReturns answers (model %s)", reply.model)
        self._failing = None
        return [Forecast(Family(r.conversation), within_s, r.probability, r.probability, 1.0, kind)
                for r in reply.returns]

    def close(self) -> None:
        self._channel.close()


class PredictorForecastSources:
    """What the live `predictive` policy reads from the predictor: family
    bursts (PredictorForecasts) and session returns (PredictorReturnForecasts),
    one list (forecasts.CombinedForecasts); either failing leaves the other."""

    def __init__(self, address: str, telemetry: Telemetry | None, policy: PolicyConfig,
                 timeout_s: float = 1.0, tls: TlsMaterial | None = None) -> None:
        self.bursts = PredictorForecasts(address, telemetry, timeout_s, tls)
        self.returns = PredictorReturnForecasts(address, telemetry, policy, timeout_s, tls)
        self._combined = CombinedForecasts([self.bursts, self.returns])

    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        return self._combined.forecast(now, horizon_s, max_families)

    def close(self) -> None:
        self.bursts.close()
        self.returns.close()
