"""The re-send rule (migration.resend), which the reference router and the
simulator both apply when a request's node dies."""
from speckv.loadgen.engines.emulated import EngineJob
from speckv.loadgen.experiments.metrics import RequestRecord
from speckv.loadgen.experiments.migration import resend
from speckv.services.common.traces import TraceRequest

REQUEST = TraceRequest(1.0, 100, 20, (1, 2, 3), 32, "f")


def _record() -> RequestRecord:
    return RequestRecord("r", 1.0, "f", 100, 20)


def test_before_the_first_token_the_request_goes_again_unchanged():
    record = _record()
    job = EngineJob("r", 100, 20)
    assert resend(record, REQUEST, job, attempt=0, limit=1) == REQUEST
    assert resend(_record(), REQUEST, None, attempt=0, limit=1) == REQUEST
    assert record.retried and not record.error


def test_during_decode_the_streamed_tokens_join_the_prompt():
    job = EngineJob("r", 100, 20, first_token_s=2.0, tokens_out=5)
    again = resend(_record(), REQUEST, job, attempt=0, limit=2)
    assert again is not None
    assert (again.prompt_tokens, again.output_tokens, again.block_hashes) == (105, 15, REQUEST.block_hashes)


def test_at_least_one_token_is_left_to_generate():
    job = EngineJob("r", 100, 20, first_token_s=2.0, tokens_out=20)
    again = resend(_record(), REQUEST, job, attempt=0, limit=1)
    assert again is not None and again.output_tokens == 1


def test_past_the_migration_limit_the_request_is_lost():
    record = _record()
    assert resend(record, REQUEST, EngineJob("r", 100, 20), attempt=1, limit=1) is None
    assert record.error == "lost: its node died 2 times (migration limit 1)" and not record.retried
