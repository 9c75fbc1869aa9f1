"""gRPC clients the scheduler core uses through small interfaces: prefix
confirmation against a node's kvstore (KVStore.Lookup), arrival reports to
the predictor (Predictor.ObserveArrivals) and forecasts from it
(Predictor.Forecast, a ForecastSource). Every call carries a deadline.
Channels are instrumented, so a Route's Lookup joins the Route's trace."""
from __future__ import annotations

import logging
import threading
from typing import Sequence

import grpc

from speckv.services.common.ids import Family
from speckv.services.common.server import open_channel
from speckv.services.common.telemetry import Telemetry
from speckv.services.scheduler.arrival_reports import ArrivalRecord
from speckv.services.scheduler.forecasts import Forecast
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc, predictor_pb2, predictor_pb2_grpc

log = logging.getLogger(__name__)


class KVStoreConfirmer:
    """Confirms a cached prefix with the node itself. One channel per address."""

    def __init__(self, telemetry: Telemetry | None, timeout_s: float) -> None:
        self._telemetry = telemetry
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
                channel = self._channels[address] = open_channel(address, self._telemetry)
            return channel


class PredictorSender:
    """Sends one batch of arrivals per ObserveArrivals call."""

    def __init__(self, address: str, telemetry: Telemetry | None, timeout_s: float = 2.0) -> None:
        self._channel = open_channel(address, telemetry)
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

    def __init__(self, address: str, telemetry: Telemetry | None, timeout_s: float = 1.0) -> None:
        self._channel = open_channel(address, telemetry)
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
