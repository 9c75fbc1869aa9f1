"""The interceptor's rule for a client that went away, on each wrapper, with a
scripted servicer context. Real grpc decides by a race whether a cancelled
request stream reaches the handler as an error or as an ordinary end
(tests/services/test_client_gone.py runs the real thing); here each branch is
forced: grpc's bare RpcError on an inactive call is re-raised as the same
object and recorded CANCELLED with nothing logged above DEBUG; the same error
on a live call, or a subclass (an error of a call the servicer made itself),
is a bug: INTERNAL, logged with its traceback."""
from __future__ import annotations

import logging
from typing import Any, Iterator

import grpc
import pytest

from speckv.services.common.rpc.interceptor import ErrorMappingInterceptor

METHOD = "/speckv.v1.Test/Method"


class _Aborted(Exception):
    """What grpc's context.abort raises (a bare Exception there)."""


class ScriptedContext:
    """The parts of grpc.ServicerContext the interceptor reads."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def is_active(self) -> bool:
        return self.active

    def code(self) -> grpc.StatusCode | None:
        return self.aborted[0] if self.aborted else None

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def send_initial_metadata(self, metadata: Any) -> None:
        pass


class Recorded:
    def __init__(self) -> None:
        self.codes: list[str] = []

    def record(self, method: str, status: str, seconds: float) -> None:
        self.codes.append(status)


class ClientCallError(grpc.RpcError):
    """An error of an outgoing call: grpc's client raises subclasses only."""


def _failing(error: Exception) -> Iterator[int]:
    yield 1
    raise error


def _read_all(requests: Iterator[int], context: Any) -> int:
    return sum(requests)


def _echo(requests: Iterator[int], context: Any) -> Iterator[int]:
    yield from requests


def _call(wrapper: str, error: Exception, context: ScriptedContext, recorded: Recorded) -> None:
    interceptor = ErrorMappingInterceptor(recorded)  # type: ignore[arg-type]
    if wrapper == "unary":
        interceptor._wrap_unary(METHOD, _read_all, True)(_failing(error), context)
    else:
        list(interceptor._wrap_stream(METHOD, _echo, True)(_failing(error), context))


@pytest.mark.parametrize("wrapper", ["unary", "stream"])
def test_grpcs_error_on_an_inactive_call_is_reraised_cancelled_and_quiet(wrapper: str,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    error, context, recorded = grpc.RpcError(), ScriptedContext(active=False), Recorded()
    with caplog.at_level(logging.DEBUG), pytest.raises(grpc.RpcError) as raised:
        _call(wrapper, error, context, recorded)
    assert raised.value is error  # the very object: grpc stays quiet only about its own
    assert recorded.codes == ["CANCELLED"] and context.aborted is None
    assert [r for r in caplog.records if r.levelno > logging.DEBUG or r.exc_info] == []


@pytest.mark.parametrize("wrapper", ["unary", "stream"])
@pytest.mark.parametrize("error, active", [(grpc.RpcError(), True), (ClientCallError(), False)],
                         ids=["bare error on a live call", "a servicer's own call failed"])
def test_any_other_rpc_error_is_internal_and_logged(wrapper: str, error: Exception, active: bool,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    context, recorded = ScriptedContext(active), Recorded()
    with caplog.at_level(logging.DEBUG), pytest.raises(_Aborted):
        _call(wrapper, error, context, recorded)
    assert recorded.codes == ["INTERNAL"]
    assert context.aborted is not None and context.aborted[0] is grpc.StatusCode.INTERNAL
    assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)


def test_a_response_stream_closed_under_its_handler_is_cancelled() -> None:
    """A client that hangs up on a response stream: grpc closes the generator."""
    context, recorded = ScriptedContext(active=True), Recorded()
    stream = ErrorMappingInterceptor(recorded)._wrap_stream(  # type: ignore[arg-type]
        METHOD, _echo, True)(iter([1, 2, 3]), context)
    assert next(stream) == 1
    context.active = False
    stream.close()
    assert recorded.codes == ["CANCELLED"]


@pytest.mark.parametrize("active, code", [(True, "OK"), (False, "CANCELLED")])
def test_a_handler_that_ends_normally_is_ok_only_while_its_call_is_active(active: bool, code: str) -> None:
    context, recorded = ScriptedContext(active), Recorded()
    assert ErrorMappingInterceptor(recorded)._wrap_unary(  # type: ignore[arg-type]
        METHOD, _read_all, True)(iter([1, 2]), context) == 3
    assert recorded.codes == [code]
