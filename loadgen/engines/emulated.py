"""Emulated inference engine: continuous batching with chunked prefill, step
times from a profile of a real model on a real GPU. Pure: no clock reads, no
sleeps, no threads; the caller passes `now` (seconds on its clock, real or
virtual) to `submit` and `advance`, so the same object serves the live
cluster and a discrete-event simulator.

Algorithm (vLLM V1-style scheduler, FCFS):
- A request arrives with `cached` prompt tokens already on this node and,
  when the route chose a pull, `fetch` more tokens on another node. A pull
  occupies this node's inbound link: it starts when the link is free and
  lasts link.transfer_ms(fetch bytes); links serve pulls FIFO, so a burst of
  pulls queues on the link. Cached tokens that only the node's host tier
  held are promoted over its host link at the same time (FIFO too, lasting
  host_link.transfer_ms(promote bytes)). After both the request waits with
  cached + fetch tokens skipped.
- A step starts when the engine is free and work is ready. Its batch is every
  running (decoding) sequence, one token each, up to max_num_seqs, then waiting
  requests in arrival order, each taking a prefill chunk of at most the
  remaining budget max_batched_tokens - decodes (chunked prefill).
- Step time (ms) = sum over prefill chunks of c tokens after x context tokens
  of ms_per_token * c + ms_per_token_pair * (c * x + c * (c + 1) / 2)
  + overhead_ms per request whose prefill completes in the step
  + per decoding sequence, its KV read: context * kv_bytes_per_token / HBM
  + when the step holds decodes but no prefill, decode_weights_ms +
  decode_step_overhead_ms (a prefill step already reads the weights).
  The chunk terms telescope, so a request alone on the engine has TTFT
  exactly profile.prefill_ms(new, cached), however it is chunked.
- The first token is out at the end of the step that completes the prefill
  (TTFT); each later step yields one token (TPOT = mean gap after the first).

KV memory is not a limit here (max_num_seqs is): with 62.5 GiB of KV and
prompts of ~12k tokens (1.5 GiB) an H100 holds ~40 sequences, which the
trace's ~3 requests/s with ~350 output tokens rarely exceed per node.
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Protocol

from speckv.services.common.engine_profile import EngineProfile, LinkModel


class Phase(enum.Enum):
    FETCHING = "fetching"
    WAITING = "waiting"
    DECODING = "decoding"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Continuous-batching limits and decode costs beyond the prefill profile.
    Times in ms of the real model, bandwidth in GB/s."""

    max_batched_tokens: int
    max_num_seqs: int
    decode_weights_ms: float
    hbm_gb_per_s: float
    decode_step_overhead_ms: float


@dataclass(slots=True, eq=False)
class EngineJob:
    """One request on one engine. Tokens are prompt tokens; times are seconds
    on the engine's clock. Equal only to itself: the engine removes a job
    from its queues by identity (field-wise equality compared all 13 fields
    of every job ahead of it in the list)."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0  # on this node at dispatch
    fetch_tokens: int = 0  # pulled from another node before prefill
    fetch_bytes: int = 0  # real model bytes of the pull
    promote_bytes: int = 0  # real model bytes of cached tokens promoted from the host tier before prefill
    submitted_s: float = 0.0
    ready_s: float = 0.0  # pull done (= submitted_s without a pull)
    prefilled: int = 0  # prompt tokens computed so far (beyond the skipped ones)
    first_token_s: float | None = None
    finished_s: float | None = None
    tokens_out: int = 0
    phase: Phase = Phase.WAITING

    @property
    def skipped_tokens(self) -> int:
        return job_skipped_tokens(self)

    @property
    def to_prefill(self) -> int:
        return self.prompt_tokens - self.skipped_tokens - self.prefilled

    @property
    def context_tokens(self) -> int:
        return job_context_tokens(self)


class EngineEventKind(enum.Enum):
    FIRST_TOKEN = "first_token"  # prefill done: its new blocks can be stored
    FINISHED = "finished"


@dataclass(slots=True)
class EngineEvent:
    kind: EngineEventKind
    job: EngineJob
    time_s: float


@dataclass(slots=True)
class EngineLoad:
    """What a heartbeat reports: prefill tokens waiting, tokens of running
    sequences, request counts, and the engine's own estimate of the time (ms)
    to prefill what waits (None: this engine has no time model)."""

    queued_tokens: int
    running_tokens: int
    waiting_requests: int
    running_requests: int
    queued_prefill_ms: float | None = None


class Engine(Protocol):
    """What the live driver and a simulator need from an engine (the emulated
    one here; a real PyTorch one can take its place)."""

    node_id: str

    def submit(self, job: EngineJob, now: float) -> None: ...

    def advance(self, now: float) -> list[EngineEvent]: ...

    def next_event_s(self) -> float | None: ...

    def load(self) -> EngineLoad: ...


@dataclass(slots=True)
class _Step:
    start_s: float
    end_s: float
    chunks: list[tuple[EngineJob, int]]
    decodes: list[EngineJob]


@dataclass(slots=True)
class StepCost:
    """Breakdown of one step, ms."""

    prefill_ms: float = 0.0
    overhead_ms: float = 0.0
    decode_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.prefill_ms + self.overhead_ms + self.decode_ms


class EmulatedEngine:
    def __init__(self, node_id: str, profile: EngineProfile, limits: EngineLimits, link: LinkModel,
                 kv_bytes_per_token: int, host_link: LinkModel | None = None) -> None:
        """host_link: the node's host<->device link for promotions (None: promotions take no time)."""
        self.node_id = node_id
        self._profile, self._limits, self._link = profile, limits, link
        self._host_link = host_link
        self._host_free_s = 0.0  # host link idle from here on
        self._kv_bytes_per_token = kv_bytes_per_token
        self._fetching: list[EngineJob] = []
        self._waiting: deque[EngineJob] = deque()
        self._running: list[EngineJob] = []
        self._step: _Step | None = None
        self._free_s = 0.0  # engine idle from here on
        self._link_free_s = 0.0  # inbound link idle from here on
        self.steps = 0

    # --- inputs -------------------------------------------------------------
    def submit(self, job: EngineJob, now: float) -> None:
        """Queues job at `now` (advance to now first, so steps are current)."""
        if job.prompt_tokens <= 0 or job.output_tokens < 0:
            raise ValueError(f"job {job.request_id}: prompt_tokens must be > 0, output_tokens >= 0")
        job.submitted_s = now
        ready = now
        if job.fetch_tokens > 0:
            ready = max(now, self._link_free_s) + self._link.transfer_ms(job.fetch_bytes) / 1e3
            self._link_free_s = ready
        if job.promote_bytes > 0 and self._host_link is not None:
            promoted = max(now, self._host_free_s) + self._host_link.transfer_ms(job.promote_bytes) / 1e3
            self._host_free_s = promoted
            ready = max(ready, promoted)
        if ready > now:
            job.ready_s = ready
            job.phase = Phase.FETCHING
            self._fetching.append(job)
        else:
            job.ready_s = now
            job.phase = Phase.WAITING
            self._waiting.append(job)

    def advance(self, now: float) -> list[EngineEvent]:
        """Runs every step that ends at or before `now`; returns their events
        in time order. A step that starts by `now` is planned (its batch fixed)."""
        events: list[EngineEvent] = []
        while True:
            if self._step is None and self._skip_ahead(now, events):
                continue
            if self._step is None:
                start = self._next_start(now)
                if start is None or start > now:
                    return events
                self._step = self._plan(start)
                if self._step is None:
                    return events
            if self._step.end_s > now:
                return events
            events.extend(self._finish(self._step))
            self._step = None

    def _skip_ahead(self, now: float, events: list[EngineEvent]) -> bool:
        """Hook for a faster engine to cover several steps at once, appending
        their events; True when it advanced. The plain engine steps one by one."""
        return False

    def next_event_s(self) -> float | None:
        """When something next happens: the running step's end, else the next
        time work is ready (None: idle with nothing pending)."""
        if self._step is not None:
            return self._step.end_s
        return self._next_start(float("inf"), promote=False)

    def load(self) -> EngineLoad:
        waiting = [*self._fetching, *self._waiting]
        running_tokens = self._running_context()
        return EngineLoad(queued_tokens=sum(j.to_prefill for j in waiting), running_tokens=running_tokens,
                          waiting_requests=len(waiting), running_requests=len(self._running),
                          queued_prefill_ms=self.queued_prefill_ms(waiting, running_tokens))

    def queued_prefill_ms(self, waiting: list[EngineJob], running_tokens: int) -> float:
        """Time (ms) to prefill every waiting job from here, by the step model:
        each job's remaining prefill alone (the chunk terms telescope, so
        chunking does not change it), plus the running sequences' KV reads in
        every step that prefill takes (steps = remaining tokens over the
        budget left beside the decodes). What a job arriving now waits for,
        attention included: queued tokens alone miss the quadratic term that
        makes one 100k-token prompt cost seconds."""
        if not waiting:
            return 0.0
        p = self._profile
        total_ms, tokens = 0.0, 0
        for j in waiting:
            done = _done_tokens(j)
            tokens += j.prompt_tokens - done
            total_ms += p.prefill_ms(j.prompt_tokens - done, done)
        budget = max(1, self._limits.max_batched_tokens - min(len(self._running), self._limits.max_num_seqs))
        steps = -(-tokens // budget)
        return total_ms + steps * self.kv_read_ms(running_tokens)

    def kv_read_ms(self, context_tokens: int) -> float:
        """One decode step's read of that many context tokens' KV from HBM (ms)."""
        return context_tokens * self._kv_bytes_per_token / (self._limits.hbm_gb_per_s * 1e9) * 1e3

    def _running_context(self) -> int:
        """Context tokens of the running sequences (a faster engine may cache it)."""
        return context_sum(self._running)

    # --- stepping ------------------------------------------------------------
    def step_cost(self, chunks: list[tuple[EngineJob, int]], decodes: list[EngineJob]) -> StepCost:
        """The time model of one step (see the module docstring)."""
        cost = StepCost()
        p = self._profile
        for job, c in chunks:
            x = _done_tokens(job)
            cost.prefill_ms += p.ms_per_token * c + p.ms_per_token_pair * (c * x + c * (c + 1) / 2)
            if c == job.prompt_tokens - x:  # the chunk completes the prefill
                cost.overhead_ms += p.overhead_ms
        if decodes:
            cost.decode_ms += self.kv_read_ms(context_sum(decodes))
            if not chunks:
                cost.decode_ms += self._limits.decode_weights_ms + self._limits.decode_step_overhead_ms
        return cost

    def _next_start(self, now: float, promote: bool = True) -> float | None:
        """When the next step can start: at once after a step while sequences
        run, else when the engine is free and the first queued job is ready."""
        if promote and self._fetching:
            self._promote(now)
        if self._running:
            return self._free_s  # queued work can start no earlier than the engine is free
        starts = [max(self._free_s, min(j.ready_s for j in queue)) for queue in (self._waiting, self._fetching)
                  if queue]
        return min(starts) if starts else None

    def _promote(self, now: float) -> None:
        """Pulls done by `now` join the prefill queue, in the order they finished."""
        done = sorted((j for j in self._fetching if j.ready_s <= now), key=lambda j: (j.ready_s, j.request_id))
        for job in done:
            self._fetching.remove(job)
            job.phase = Phase.WAITING
            self._waiting.append(job)

    def _plan(self, start: float) -> _Step | None:
        decodes = self._running[:self._limits.max_num_seqs]
        budget = self._limits.max_batched_tokens - len(decodes)
        seats = self._limits.max_num_seqs - len(decodes)
        chunks: list[tuple[EngineJob, int]] = []
        for job in self._waiting:
            if budget <= 0 or seats <= 0:
                break
            if job.ready_s > start:
                continue
            left = job.prompt_tokens - _done_tokens(job)
            c = left if left < budget else budget
            chunks.append((job, c))
            budget -= c
            seats -= 1
        if not chunks and not decodes:
            return None
        end = start + self.step_cost(chunks, decodes).total_ms / 1e3
        return _Step(start, end, chunks, decodes)

    def _finish(self, step: _Step) -> list[EngineEvent]:
        self.steps += 1
        self._free_s = step.end_s
        events: list[EngineEvent] = []
        for job in step.decodes:
            job.tokens_out += 1
            if job.tokens_out >= job.output_tokens:
                events.append(self._complete(job, step.end_s))
        for job, c in step.chunks:
            job.prefilled += c
            if _done_tokens(job) == job.prompt_tokens:
                self._waiting.remove(job)
                job.first_token_s, job.tokens_out = step.end_s, 1
                events.append(EngineEvent(EngineEventKind.FIRST_TOKEN, job, step.end_s))
                if job.tokens_out >= job.output_tokens:
                    events.append(self._complete(job, step.end_s))
                else:
                    job.phase = Phase.DECODING
                    self._running.append(job)
        return events

    def _complete(self, job: EngineJob, t: float) -> EngineEvent:
        if job in self._running:
            self._running.remove(job)
        job.finished_s, job.phase = t, Phase.DONE
        return EngineEvent(EngineEventKind.FINISHED, job, t)


def job_skipped_tokens(job: EngineJob) -> int:
    """Prompt tokens not computed: cached plus fetched, capped so the last
    token is always computed (the engine needs its logits). The step loop,
    the decode totals and every heartbeat ask this of every running job, so
    it is a plain function (a native call in the compiled build), not only
    the property."""
    skipped = job.cached_tokens + job.fetch_tokens
    cap = job.prompt_tokens - 1
    return skipped if skipped < cap else cap


def job_context_tokens(job: EngineJob) -> int:
    """Tokens whose KV a decode step reads: the skipped and computed prompt
    plus the tokens decoded so far."""
    return job_skipped_tokens(job) + job.prefilled + job.tokens_out


def _done_tokens(job: EngineJob) -> int:
    """Prompt tokens already in KV: skipped plus prefilled."""
    return job_skipped_tokens(job) + job.prefilled


def context_sum(jobs: Iterable[EngineJob]) -> int:
    """Sum of context_tokens over jobs (tokens)."""
    total = 0
    for j in jobs:
        total += job_context_tokens(j)
    return total


@dataclass(slots=True)
class JobTimes:
    """Latencies of a finished job, ms."""

    queue_ms: float  # TTFT beyond the pull and the job's own solo prefill time
    pull_ms: float
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float


def job_times(job: EngineJob, solo_prefill_ms: float) -> JobTimes:
    """TTFT, TPOT and end-to-end from a finished job; queueing is what TTFT
    spent beyond the pull and the job's own prefill time on an idle engine."""
    if job.first_token_s is None or job.finished_s is None:
        raise ValueError(f"job {job.request_id} has not finished")
    ttft = (job.first_token_s - job.submitted_s) * 1e3
    pull = (job.ready_s - job.submitted_s) * 1e3
    decode_tokens = max(0, job.tokens_out - 1)
    tpot = (job.finished_s - job.first_token_s) * 1e3 / decode_tokens if decode_tokens else 0.0
    return JobTimes(max(0.0, ttft - pull - solo_prefill_ms), pull, ttft, tpot, (job.finished_s - job.submitted_s) * 1e3)
