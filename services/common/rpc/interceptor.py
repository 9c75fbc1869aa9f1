"""The one server interceptor that turns domain errors into gRPC status codes,
admits streaming calls under their caps, and records per-method call counts
and latencies.

A client's mistake never surfaces as UNKNOWN or INTERNAL: cores raise
`SpeckvError` subclasses, mapped here. Anything else is a bug: it is logged
with its traceback and answered INTERNAL, and the server keeps running. A
client that goes away mid-call (cancelled, deadline passed, process killed)
is no bug either: grpc's request iterator then raises a bare RpcError, which
is re-raised with a DEBUG line only. A call that ends while no longer active
(that error, a response stream closed under its handler, a handler that
outlived its deadline, a server stopping) is recorded CANCELLED. One race
stays: grpc may end a request stream as if the client had closed it before
it sees the cancel, and the handler then ends normally (recorded OK while
the call is still active).

Undecodable requests: grpc-python parses request bytes before any handler
runs and answers a parse failure INTERNAL with a logged traceback per call.
The interceptor swaps each method's request deserializer for one that never
raises (`tolerant`): bytes that do not parse (truncated or garbled protobuf,
invalid UTF-8 in a string field) become an `Undecodable` stand-in, and the
wrapped handler answers it INVALID_ARGUMENT, logging nothing.

Streaming calls (a request stream, a response stream or both) hold a handler
thread for as long as the client keeps them open, so they are admitted
through `StreamSlots`: at most `total` at once and `per_peer` from one peer
host; one more is RESOURCE_EXHAUSTED at once. Unary calls are never counted,
so the threads beyond the stream cap are always theirs (server.py sizes the
pool). An admitted stream gets its response headers at once, so a client can
tell admission from refusal without waiting for a message.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterator

import grpc

from speckv.services.common import errors
from speckv.services.common.rpc.service_metrics import RpcMetrics

log = logging.getLogger(__name__)

STATUS_OF_ERROR: dict[type[errors.SpeckvError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}


def status_of(exc: errors.SpeckvError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF_ERROR:
            return STATUS_OF_ERROR[cls]
    return grpc.StatusCode.FAILED_PRECONDITION


class Undecodable:
    """What `tolerant` hands the handler instead of a request whose bytes did
    not parse; `reason` is the parser's message."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """deserializer, returning Undecodable instead of raising (None: raw bytes, kept)."""
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's bytes
            return Undecodable(f"{type(exc).__name__}: {exc}")

    return deserialize


def _decoded(method: str, request: Any) -> Any:
    if isinstance(request, Undecodable):
        raise errors.InvalidArgument(f"{method}: request bytes do not decode ({request.reason})")
    return request


def _decoded_stream(method: str, requests: Iterator[Any]) -> Iterator[Any]:
    for request in requests:
        yield _decoded(method, request)


def peer_host(peer: str) -> str:
    """The host part of a grpc peer string ("ipv4:10.0.0.1:5000" -> "ipv4:10.0.0.1",
    "ipv6:[::1]:5000" -> "ipv6:[::1]"); other forms (unix sockets) whole."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return peer.rpartition(":")[0]
    return peer


class StreamSlots:
    """Admission of streaming calls: at most `total` at once and at most
    `per_peer` (clamped to total) from one peer host. Thread-safe.

    Invariant: in_use == sum of the per-peer counts, and every count is
    within its cap; a peer's entry exists only while its count is > 0."""

    def __init__(self, total: int, per_peer: int) -> None:
        if total < 1 or per_peer < 1:
            raise errors.InvalidArgument(f"stream caps total={total}, per_peer={per_peer}: must be >= 1")
        self.total = total
        self.per_peer = min(per_peer, total)
        self._by_peer: dict[str, int] = {}
        self._in_use = 0
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        with self._lock:
            return self._in_use

    def acquire(self, peer: str) -> None:
        """Takes a slot for a stream from peer (a host, see peer_host), or
        raises ResourceExhausted naming the cap it would exceed."""
        with self._lock:
            if self._in_use >= self.total:
                raise errors.ResourceExhausted(
                    f"{self._in_use} streams open, at most {self.total} (max_streams); retry later")
            held = self._by_peer.get(peer, 0)
            if held >= self.per_peer:
                raise errors.ResourceExhausted(
                    f"{held} streams open from {peer}, at most {self.per_peer} per peer "
                    "(max_streams_per_peer); retry later")
            self._by_peer[peer] = held + 1
            self._in_use += 1

    def release(self, peer: str) -> None:
        with self._lock:
            held = self._by_peer.get(peer, 0)
            if held <= 0:
                return  # never acquired: nothing to give back
            if held == 1:
                del self._by_peer[peer]
            else:
                self._by_peer[peer] = held - 1
            self._in_use -= 1


class ErrorMappingInterceptor(grpc.ServerInterceptor):
    """slots: the cap on streaming calls (None: uncapped)."""

    def __init__(self, metrics: RpcMetrics | None = None, slots: StreamSlots | None = None) -> None:
        self._metrics = metrics
        self._slots = slots

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        handler = handler._replace(request_deserializer=tolerant(handler.request_deserializer))
        if handler.unary_unary:
            return handler._replace(unary_unary=self._wrap_unary(method, handler.unary_unary, False))
        if handler.stream_unary:
            return handler._replace(stream_unary=self._wrap_unary(method, handler.stream_unary, True))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._wrap_stream(method, handler.unary_stream, False))
        return handler._replace(stream_stream=self._wrap_stream(method, handler.stream_stream, True))

    def _wrap_unary(self, method: str, behavior: Callable[..., Any], request_streaming: bool) -> Callable[..., Any]:
        """A unary response; request_streaming: the request is a stream (a counted call)."""

        def wrapped(request_or_iterator: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            peer = None
            try:
                if request_streaming:
                    peer = self._admit(context)
                    request_or_iterator = _decoded_stream(method, request_or_iterator)
                else:
                    request_or_iterator = _decoded(method, request_or_iterator)
                return behavior(request_or_iterator, context)
            except Exception as exc:  # noqa: BLE001 - _abort maps it to a status
                code = _status_for(exc, context)
                _abort(method, exc, context, code)
            finally:
                self._release(peer)
                self._record(method, _final_code(code, context), started)

        return wrapped

    def _wrap_stream(self, method: str, behavior: Callable[..., Iterator[Any]], request_streaming: bool):
        """A response stream (always a counted call). The slot is taken on the
        first next() and given back when the generator ends or is closed (a
        client that goes away closes it)."""

        def wrapped(request_or_iterator: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            peer = None
            try:
                peer = self._admit(context)
                request_or_iterator = (_decoded_stream(method, request_or_iterator) if request_streaming
                                       else _decoded(method, request_or_iterator))
                yield from behavior(request_or_iterator, context)
            except Exception as exc:  # noqa: BLE001
                code = _status_for(exc, context)
                _abort(method, exc, context, code)
            finally:
                self._release(peer)
                self._record(method, _final_code(code, context), started)

        return wrapped

    def _admit(self, context: grpc.ServicerContext) -> str | None:
        """Takes a stream slot for the caller's host (ResourceExhausted when
        none is left) and sends the response headers; returns the host to
        release, or None when streams are uncapped."""
        if self._slots is None:
            return None
        peer = peer_host(context.peer())
        self._slots.acquire(peer)
        try:
            context.send_initial_metadata(())
        except Exception:  # noqa: BLE001 - headers are a courtesy; the call goes on (or fails) without them
            pass
        return peer

    def _release(self, peer: str | None) -> None:
        if peer is not None and self._slots is not None:
            self._slots.release(peer)

    def _record(self, method: str, code: grpc.StatusCode, started: float) -> None:
        if self._metrics is not None:
            self._metrics.record(method, code.name, time.perf_counter() - started)


def _status_for(exc: Exception, context: grpc.ServicerContext) -> grpc.StatusCode:
    if _is_abort(exc, context):
        return context.code()
    if _client_gone(exc, context):
        return grpc.StatusCode.CANCELLED
    if isinstance(exc, errors.SpeckvError):
        return status_of(exc)
    return grpc.StatusCode.INTERNAL


def _final_code(code: grpc.StatusCode, context: grpc.ServicerContext) -> grpc.StatusCode:
    """The status to record: a handler that ended normally on a call no longer
    active (a response stream closed under it, a deadline passed, the server
    stopping) served nobody, so it counts CANCELLED, not OK."""
    if code is grpc.StatusCode.OK and not context.is_active():
        return grpc.StatusCode.CANCELLED
    return code


def _abort(method: str, exc: Exception, context: grpc.ServicerContext, code: grpc.StatusCode) -> None:
    """Ends the call with code, the status _status_for gave exc; always raises."""
    if _is_abort(exc, context):
        raise exc  # the servicer already chose a status
    if code is grpc.StatusCode.CANCELLED and type(exc) is grpc.RpcError:  # _client_gone said so
        log.debug("%s: the client went away mid-call", method)
        # The very object grpc raised, unwrapped: grpc stays quiet only about the errors it raised itself.
        raise exc
    if code is grpc.StatusCode.INTERNAL:
        log.error("unexpected error in %s", method, exc_info=exc)
        message = f"internal error in {method}: {type(exc).__name__}: {exc}"
    else:
        message = str(exc) or type(exc).__name__
    context.abort(code, message)


def _client_gone(exc: Exception, context: grpc.ServicerContext) -> bool:
    """True when exc is grpc's own signal that the client cancelled, hung up
    or ran out of deadline: its request iterator then raises a bare RpcError.
    That is the client's doing, not a bug, and there is nobody left to answer;
    an RpcError from a call this server made itself is a subclass, not bare."""
    return type(exc) is grpc.RpcError and not context.is_active()


def _is_abort(exc: Exception, context: grpc.ServicerContext) -> bool:
    # context.abort raises a bare Exception after setting the code.
    return type(exc) is Exception and context.code() is not None
