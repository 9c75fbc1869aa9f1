"""Reports a router owes the predictor, sent off the request path
(batches.py): turn ends (Predictor.ReportTurnEnds) and the arrivals of
requests the scheduler never saw (Predictor.ObserveArrivals). The scheduler
reports the arrival of every request it routes itself; a request the client
placed by its fallback would otherwise be missing from the predictor's
counts, and the forecasts would dip exactly while the scheduler is down.

Turn end times are given in the caller's seconds and sent on the
predictor's clock (to_clock); arrival times come on the predictor's clock.
A failed batch is counted and dropped, never raised: reports are best
effort and never fail a request.
"""
from __future__ import annotations

from typing import Callable

import grpc

from speckv.services.client.batches import BatchQueue, BatchSettings, BatchStats
from speckv.services.common.errors import Unavailable
from speckv.v1 import predictor_pb2, predictor_pb2_grpc


def _u32(value: int) -> int:
    """A count clamped into the proto's uint32."""
    return min(max(0, value), (1 << 32) - 1)


def _raise_unavailable(call: str, exc: grpc.RpcError) -> None:
    code = exc.code().name if hasattr(exc, "code") else "?"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    raise Unavailable(f"{call}: {code}: {details}") from None


class TurnEndReporter:
    """Finished turns to Predictor.ReportTurnEnds, batched (batch_max a call,
    waiting at most flush_s for more; capacity queued at most; timeout_s a call)."""

    def __init__(self, predictor: grpc.Channel, to_clock: Callable[[float], float], batch_max: int = 256,
                 flush_s: float = 0.2, capacity: int = 10_000, timeout_s: float = 2.0) -> None:
        self._stub = predictor_pb2_grpc.PredictorStub(predictor)
        self._to_clock, self._timeout_s = to_clock, timeout_s
        self._queue: BatchQueue[predictor_pb2.TurnEnd] = BatchQueue(
            "turn-ends", self._send, BatchSettings(batch_max, flush_s, capacity))

    def offer(self, conversation: str, arrival_s: float, end_s: float, prompt_tokens: int, output_tokens: int,
              follow_ups: int = 0) -> bool:
        """One turn: arrival and end in the caller's seconds; follow_ups as the request announced them.
        Never blocks; False when dropped (queue full, or closed)."""
        try:
            message = predictor_pb2.TurnEnd(
                conversation=conversation, arrival_s=self._to_clock(arrival_s), end_s=self._to_clock(end_s),
                prompt_tokens=_u32(prompt_tokens), output_tokens=_u32(output_tokens), follow_ups=_u32(follow_ups))
        except (ValueError, TypeError):  # a name protobuf cannot encode: dropped, counted, never raised
            return self._queue.reject()
        return self._queue.offer(message)

    def stats(self) -> BatchStats:
        return self._queue.stats()

    def close(self, timeout_s: float = 10.0) -> None:
        self._queue.close(timeout_s)

    def _send(self, batch: list[predictor_pb2.TurnEnd]) -> None:
        try:
            self._stub.ReportTurnEnds(predictor_pb2.TurnEndBatch(turn_ends=batch), timeout=self._timeout_s)
        except grpc.RpcError as exc:
            _raise_unavailable("ReportTurnEnds", exc)


class ArrivalReporter:
    """Arrivals to Predictor.ObserveArrivals, one stream call per batch, with
    times already on the predictor's clock. Rejected observations are the
    predictor's to count (ObserveSummary)."""

    def __init__(self, predictor: grpc.Channel, settings: BatchSettings = BatchSettings(),
                 timeout_s: float = 2.0) -> None:
        self._stub = predictor_pb2_grpc.PredictorStub(predictor)
        self._timeout_s = timeout_s
        self._queue: BatchQueue[predictor_pb2.Arrival] = BatchQueue("arrivals", self._send, settings)

    def offer(self, time_s: float, family: str, node_id: str, prompt_tokens: int, cached_tokens: int = 0) -> bool:
        try:
            message = predictor_pb2.Arrival(time_s=time_s, family=family, node_id=node_id,
                                            prompt_tokens=_u32(prompt_tokens), cached_tokens=_u32(cached_tokens))
        except (ValueError, TypeError):  # a name protobuf cannot encode: dropped, counted, never raised
            return self._queue.reject()
        return self._queue.offer(message)

    def stats(self) -> BatchStats:
        return self._queue.stats()

    def close(self, timeout_s: float = 10.0) -> None:
        self._queue.close(timeout_s)

    def _send(self, batch: list[predictor_pb2.Arrival]) -> None:
        try:
            self._stub.ObserveArrivals(iter(batch), timeout=self._timeout_s)
        except grpc.RpcError as exc:
            _raise_unavailable("ObserveArrivals", exc)
