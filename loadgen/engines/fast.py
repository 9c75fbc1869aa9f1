"""The emulated engine with decode stretches jumped in one go.

Same object, same time model: FastEngine is loadgen.engine.EmulatedEngine
(continuous batching, chunked prefill, step costs from the profile) plus one
shortcut. While the engine holds only running (decoding) sequences, at most
max_num_seqs of them, and nothing waits or is being fetched, every step is
a pure decode step whose cost is known in closed form: with R sequences of
total context C the k-th step from now costs
    a + b * (C + (k - 1) * R)      seconds,
a = (decode_weights_ms + decode_step_overhead_ms) / 1e3 and
b = kv_bytes_per_token / (hbm_gb_per_s * 1e9), so k steps take
    T(k) = k * a + b * (k * C + R * k * (k - 1) / 2).
`advance(now)` jumps over the whole decode steps that end by `now` (never
past the first sequence's last token), and `next_event_s()` answers the time
of the next first-token or finished event, not the next step's end, so a
simulator wakes an engine a few times per request instead of once per
decode step (~6 ms). Results equal step-by-step stepping up to float
rounding (tests/unit/loadgen/engines/test_fast.py checks this against EmulatedEngine).

Pulls: the simulator moves pulled KV over its network model and submits
the job when the bytes are in, so jobs here carry fetch_tokens = 0; with a
pull pending the shortcut is off and the base stepping runs.
"""
from __future__ import annotations

import math

from speckv.loadgen.engines.emulated import EmulatedEngine, EngineEvent, EngineJob, EngineLimits, job_context_tokens
from speckv.services.common.engine_profile import EngineProfile, LinkModel

_EPS_S = 1e-9


class FastEngine(EmulatedEngine):
    def __init__(self, node_id: str, profile: EngineProfile, limits: EngineLimits, link: LinkModel,
                 kv_bytes_per_token: int) -> None:
        super().__init__(node_id, profile, limits, link, kv_bytes_per_token)
        self._a = (limits.decode_weights_ms + limits.decode_step_overhead_ms) / 1e3
        self._b = kv_bytes_per_token / (limits.hbm_gb_per_s * 1e9)
        self._totals_key: tuple[int, int] = (-1, -1)
        self._totals: tuple[int, int] = (0, 0)

    def _running_context(self) -> int:
        """From the cached totals (see _running_totals)."""
        return self._running_totals()[1] if self._running else 0

    def _skip_ahead(self, now: float, events: list[EngineEvent]) -> bool:
        return self._decode_only() and self._jump(now, events)

    def next_event_s(self) -> float | None:
        if not self._decode_only(allow_step=True):
            return super().next_event_s()
        running = self._running
        planned = 1 if self._step is not None else 0
        base = self._step.end_s if self._step is not None else self._free_s
        left, context = self._running_totals()
        k = left - planned
        context += planned * len(running)
        return base + self._span(max(0, k), context, len(running))

    # --- the shortcut ---------------------------------------------------------
    def _decode_only(self, allow_step: bool = False) -> bool:
        if self._waiting or self._fetching or not self._running:
            return False
        if len(self._running) > self._limits.max_num_seqs:
            return False
        return allow_step or self._step is None

    def _span(self, k: int, context: int, seqs: int) -> float:
        """Seconds of k decode steps of `seqs` sequences starting at `context` tokens."""
        return k * self._a + self._b * (k * context + seqs * k * (k - 1) / 2)

    def _jump(self, now: float, events: list[EngineEvent]) -> bool:
        """Runs the whole decode steps that end by now (up to the first
        completion) at once; False when not even one fits."""
        running = self._running
        seqs = len(running)
        k_done, context = self._running_totals()
        k = min(k_done, self._fit(now - self._free_s, context, seqs))
        if k <= 0:
            return False
        end = self._free_s + self._span(k, context, seqs)
        self.steps += k
        self._free_s = end
        for job in list(running):
            job.tokens_out += k
            if job.tokens_out >= job.output_tokens:
                events.append(self._complete(job, end))
        return True

    def _running_totals(self) -> tuple[int, int]:
        """_decode_totals of the running sequences (non-empty), computed once
        per engine state. Only a step (base _finish, or _jump here) changes a
        running sequence's tokens or the running set, and each bumps `steps`;
        the set's length is in the key too, should anything else change it."""
        key = (self.steps, len(self._running))
        if key != self._totals_key:
            self._totals = _decode_totals(self._running)
            self._totals_key = key
        return self._totals

    def _fit(self, budget_s: float, context: int, seqs: int) -> int:
        """The most decode steps whose total time is <= budget_s."""
        if budget_s < 0:
            return 0
        qa = self._b * seqs / 2
        qb = self._a + self._b * context - qa
        if qa > 0:
            k = int((-qb + math.sqrt(qb * qb + 4 * qa * budget_s)) / (2 * qa))
        else:
            k = int(budget_s / qb) if qb > 0 else 0
        k = max(0, k)
        while k > 0 and self._span(k, context, seqs) > budget_s + _EPS_S:
            k -= 1
        while self._span(k + 1, context, seqs) <= budget_s + _EPS_S:
            k += 1
        return k


def _decode_totals(running: list[EngineJob]) -> tuple[int, int]:
    """(fewest tokens any running sequence has left to decode, total context
    tokens of all of them) in one pass over a non-empty list: this runs on
    every engine wake."""
    left = running[0].output_tokens - running[0].tokens_out
    context = 0
    for j in running:
        r = j.output_tokens - j.tokens_out
        if r < left:
            left = r
        context += job_context_tokens(j)
    return left, context
