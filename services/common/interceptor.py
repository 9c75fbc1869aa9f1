"""The one server interceptor that turns domain errors into gRPC status codes
and records per-method call counts and latencies.

A client's mistake never surfaces as UNKNOWN or INTERNAL: cores raise
`SpeckvError` subclasses, mapped here. Anything else is a bug: it is logged
with its traceback and answered INTERNAL, and the server keeps running.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterator

import grpc

from speckv.services.common import errors
from speckv.services.common.service_metrics import RpcMetrics

log = logging.getLogger(__name__)

STATUS_OF_ERROR: dict[type[errors.SpeckvError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_of(exc: errors.SpeckvError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF_ERROR:
            return STATUS_OF_ERROR[cls]
    return grpc.StatusCode.FAILED_PRECONDITION


class ErrorMappingInterceptor(grpc.ServerInterceptor):
    def __init__(self, metrics: RpcMetrics | None = None) -> None:
        self._metrics = metrics

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary:
            return handler._replace(unary_unary=self._wrap_unary(method, handler.unary_unary))
        if handler.stream_unary:
            return handler._replace(stream_unary=self._wrap_unary(method, handler.stream_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._wrap_stream(method, handler.unary_stream))
        return handler._replace(stream_stream=self._wrap_stream(method, handler.stream_stream))

    def _wrap_unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(request_or_iterator: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                return behavior(request_or_iterator, context)
            except Exception as exc:  # noqa: BLE001 - _abort maps it to a status
                code = _status_for(exc, context)
                _abort(method, exc, context)
            finally:
                self._record(method, code, started)

        return wrapped

    def _wrap_stream(self, method: str, behavior: Callable[..., Iterator[Any]]):
        def wrapped(request_or_iterator: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                yield from behavior(request_or_iterator, context)
            except Exception as exc:  # noqa: BLE001
                code = _status_for(exc, context)
                _abort(method, exc, context)
            finally:
                self._record(method, code, started)

        return wrapped

    def _record(self, method: str, code: grpc.StatusCode, started: float) -> None:
        if self._metrics is not None:
            self._metrics.record(method, code.name, time.perf_counter() - started)


def _status_for(exc: Exception, context: grpc.ServicerContext) -> grpc.StatusCode:
    if _is_abort(exc, context):
        return context.code()
    if isinstance(exc, errors.SpeckvError):
        return status_of(exc)
    return grpc.StatusCode.INTERNAL


def _abort(method: str, exc: Exception, context: grpc.ServicerContext) -> None:
    """Ends the call with the status for exc; always raises."""
    if _is_abort(exc, context):
        raise exc  # the servicer already chose a status
    code = _status_for(exc, context)
    if code is grpc.StatusCode.INTERNAL:
        log.error("unexpected error in %s", method, exc_info=exc)
        message = f"internal error in {method}: {type(exc).__name__}: {exc}"
    else:
        message = str(exc) or type(exc).__name__
    context.abort(code, message)


def _is_abort(exc: Exception, context: grpc.ServicerContext) -> bool:
    # context.abort raises a bare Exception after setting the code.
    return type(exc) is Exception and context.code() is not None
