"""A real vLLM OpenAI server as one node's engine in the live driver
(driver.LiveEngines), for `speckv bench e2e --engine vllm`.

The server runs the model; this object only sends each job as a streamed,
token-id completion (openai_stream.py) on a worker thread and turns what
comes back into the driver's engine events. The server's connector
(SpeckvConnector) reads and writes the node's kvstore itself, so the jobs
own their KV (VllmJobs.owns_kv) and the router stores nothing.

Times: a job's first_token_s and finished_s are its submit time on the
engine clock plus the wall seconds the server took to its first streamed
token and to the end, times the replay's speed (the engine clock is trace
time), measured from the submit itself, so waiting for a worker thread
counts as queueing, as it would in a router's connection pool.

Both events of a job are handed to the driver when its stream ends: what the
router books at the first token (the prompt tokens the engine did not
compute: vLLM's `cached_tokens`, its own prefix cache and the connector's
loads together) is only in the stream's final usage. A stream that fails
(HTTP error, connection refused, timeout) finishes its job with `error` set,
which the router records as a failed request.

Load for heartbeats: prompt tokens of the jobs sent and not yet at their
first token (queued), and of those past it (running, with their output
tokens), counted on this side of the API: vLLM's OpenAI server does not
report its queue per request, and a router in front of it knows exactly
what it sent.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Callable

from speckv.loadgen.engines.emulated import EngineEvent, EngineEventKind, EngineJob, EngineLoad, Phase
from speckv.loadgen.engines.openai_stream import stream_completion

log = logging.getLogger(__name__)
WORKERS = 64  # concurrent streams per server: above any slice's in-flight requests on a CPU engine
STREAM_TIMEOUT_S = 600.0


@dataclass(slots=True, eq=False)
class VllmJob(EngineJob):
    """An EngineJob with its prompt's token ids. After the stream ends
    cached_tokens is what the engine did not compute (vLLM's figure) and
    output_ids the generated ids; error is set when the stream failed."""

    tokens: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    error: str = ""
    pull_from: str = ""  # the node Route chose to fetch the prefix from: the connector pulls it ("" none)
    route_cached_tokens: int = 0  # what Route said the node holds itself (to attribute a pull's tokens)
    route_fetch_tokens: int = 0  # what Route said the pull brings


def attributed_pull(job: VllmJob, skipped: int) -> int:
    """The tokens a pull brought, attributed: vLLM reports one figure, the
    prompt tokens it did not compute (its own cache, the node's kvstore and
    the pull together); what exceeds Route's figure for the node itself,
    up to what Route said the pull brings, is counted as pulled."""
    if not job.pull_from:
        return 0
    return max(0, min(skipped - job.route_cached_tokens, job.route_fetch_tokens))


def pull_params(node: str) -> dict[str, Any] | None:
    """A request's kv_transfer_params asking its engine's SpeckvConnector to
    pull the prefix from node's kvstore (None: no pull)."""
    return {"speckv": {"pull_from": node}} if node else None


class VllmServerEngine:
    """One node's vLLM server (module docstring). speed: trace seconds per
    wall second (the replay's compression)."""

    def __init__(self, node_id: str, base_url: str, model_name: str, speed: float = 1.0,
                 workers: int = WORKERS, on_close: Callable[[], None] | None = None) -> None:
        """on_close: called by close() (e.g. stopping the server process)."""
        self.node_id = node_id
        self.url, self.model_name, self._speed = base_url, model_name, speed
        self._on_close = on_close
        self._pool = futures.ThreadPoolExecutor(workers, thread_name_prefix=f"vllm-{node_id}")
        self._lock = threading.Lock()
        self._waiting: dict[int, VllmJob] = {}  # id(job) -> sent, before its first token
        self._running: dict[int, VllmJob] = {}  # past its first token
        self._events: list[EngineEvent] = []
        self._last_now = 0.0
        self.failures = 0

    def submit(self, job: EngineJob, now: float) -> None:
        if not isinstance(job, VllmJob) or not job.tokens:
            raise ValueError(f"job {job.request_id}: a vLLM server runs VllmJobs with token ids")
        job.submitted_s = job.ready_s = now
        job.phase = Phase.WAITING
        with self._lock:
            self._waiting[id(job)] = job
            self._last_now = max(self._last_now, now)
        self._pool.submit(self._run, job, time.perf_counter())

    def advance(self, now: float) -> list[EngineEvent]:
        """Every event of the streams that ended (their times are in the past)."""
        with self._lock:
            self._last_now = max(self._last_now, now)
            events, self._events = self._events, []
        events.sort(key=lambda event: event.time_s)
        return events

    def next_event_s(self) -> float | None:
        """None when nothing is in flight (the driver's idle test); else the
        latest now seen: an event may come at any moment."""
        with self._lock:
            busy = self._waiting or self._running or self._events
            return self._last_now if busy else None

    def load(self) -> EngineLoad:
        with self._lock:
            queued = sum(j.prompt_tokens for j in self._waiting.values())
            running = sum(j.prompt_tokens + j.output_tokens for j in self._running.values())
            return EngineLoad(queued, running, len(self._waiting), len(self._running))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._on_close is not None:
            self._on_close()

    def _run(self, job: VllmJob, submitted_at: float) -> None:
        try:
            done = stream_completion(self.url, self.model_name, job.tokens, job.output_tokens, STREAM_TIMEOUT_S,
                                     on_first_token=lambda: self._first_token(job),
                                     kv_transfer_params=pull_params(job.pull_from))
        except Exception as exc:  # noqa: BLE001 - any failure of the server is the request's, never the driver's
            log.warning("%s: request %s failed: %s", self.node_id, job.request_id, exc)
            self._fail(job, f"{self.node_id}: {exc}")
            return
        first = job.submitted_s + (done.first_token_at - submitted_at) * self._speed
        end = job.submitted_s + (done.started_at + done.total_s - submitted_at) * self._speed
        with self._lock:
            job.first_token_s, job.finished_s = first, end
            job.tokens_out, job.output_ids = len(done.token_ids), done.token_ids
            skipped = min(done.cached_tokens or 0, job.prompt_tokens - 1)
            job.fetch_tokens = attributed_pull(job, skipped)
            job.cached_tokens = skipped - job.fetch_tokens
            job.phase = Phase.DONE
            self._waiting.pop(id(job), None)
            self._running.pop(id(job), None)
            self._events += [EngineEvent(EngineEventKind.FIRST_TOKEN, job, first),
                             EngineEvent(EngineEventKind.FINISHED, job, end)]

    def _first_token(self, job: VllmJob) -> None:
        with self._lock:
            if self._waiting.pop(id(job), None) is not None:
                job.phase = Phase.DECODING
                self._running[id(job)] = job

    def _fail(self, job: VllmJob, error: str) -> None:
        with self._lock:
            self.failures += 1
            now = self._last_now
            job.error = error
            job.first_token_s = job.finished_s = max(now, job.submitted_s)
            job.phase = Phase.DONE
            self._waiting.pop(id(job), None)
            self._running.pop(id(job), None)
            self._events.append(EngineEvent(EngineEventKind.FINISHED, job, job.finished_s))

