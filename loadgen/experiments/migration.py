"""Request migration: what the reference router re-sends when a request's
node dies (issue 27; Dynamo's `--migration-limit`), by the same rule as the
simulator (loadgen/sim/membership.py):

- before its first token, the request goes again from the start;
- during decode, with the tokens already streamed appended to its prompt
  and only the rest left to generate;
- at most `limit` times a request; one more loss fails it (lost).

A request is touched by a node's death when it runs there, or when its
prompt's pull from that node has not landed yet. TTFT of a re-sent request
counts from its first submission to the first token the client saw (from
whichever attempt streamed it). Pure; the router holds the lock.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from speckv.loadgen.engines.emulated import EngineJob
from speckv.loadgen.experiments.metrics import RequestRecord
from speckv.services.common.traces import TraceRequest

# The simulator's default too (loadgen/sim/membership.py imports it: the simulator may import
# from experiments, not the other way round).
DEFAULT_MIGRATION_LIMIT = 1


@dataclass(slots=True)
class Flight:
    """One attempt at serving a request (a re-sent request gets a new one).
    Times are the engines' clock (trace seconds)."""

    record: RequestRecord
    request: TraceRequest  # what this attempt sends (a migrated decode's prompt holds the streamed tokens)
    fetch_from: str = ""
    attempt: int = 0  # re-sends before this one
    job: EngineJob | None = None  # set once submitted to an engine
    first_token_s: float | None = None  # the client's first token, from this attempt or an earlier one
    first_submitted_s: float | None = None  # the first attempt's submission

    def next_attempt(self, request: TraceRequest) -> "Flight":
        """The re-send after this attempt's node died, sending request (resend's)."""
        return Flight(self.record, request, attempt=self.attempt + 1,
                      first_token_s=self.first_token_s, first_submitted_s=self.first_submitted_s)


@dataclass(slots=True)
class MigrationCounts:
    """What one node's death did to the requests it touched."""

    resent: int = 0
    lost: int = 0


def resend(record: RequestRecord, request: TraceRequest, job: EngineJob | None, attempt: int,
           limit: int) -> TraceRequest | None:
    """The re-send rule, for the reference router and the simulator alike:
    what an attempt (`attempt` re-sends before it) sends next when its node
    died, or None when it is lost (past the migration limit; record.error
    says so). A re-send marks the record retried and carries the tokens the
    attempt's job streamed (migrated); a job before its first token streamed
    none (the engines set its first token and its first output token at once)."""
    if attempt >= limit:
        record.error = f"lost: its node died {attempt + 1} times (migration limit {limit})"
        return None
    record.retried = True
    streamed = job.tokens_out if job is not None and job.first_token_s is not None else 0
    return migrated(request, streamed)


def migrated(request: TraceRequest, streamed_tokens: int) -> TraceRequest:
    """The request a re-send carries: the streamed tokens appended to the
    prompt (its chain ids unchanged: the appended tokens form no full block
    the trace names), at least one token left to generate."""
    if streamed_tokens <= 0:
        return request
    return replace(request, prompt_tokens=request.prompt_tokens + streamed_tokens,
                   output_tokens=max(1, request.output_tokens - streamed_tokens))


def touched_by(flight: Flight, node: str, now_s: float) -> bool:
    """Whether node's death takes this attempt down: it runs there, or its
    pull from there is still under way at now_s (engine clock)."""
    job = flight.job
    if job is None:
        return False
    if flight.record.node_id == node:
        return True
    return flight.fetch_from == node and job.fetch_tokens > 0 and now_s < job.ready_s
