"""Turn records of conversations, from trace requests.

A conversation is a request family (load the Mooncake conversation trace with
family="conversation": a family is the chain of hash ids through block 1, so a
conversation's later turns, whose prompts extend the earlier ones, share it).
Its turns are its requests in arrival order; turn k's next turn is turn k+1.

A turn ends when its answer is complete: end_s = arrival_s + service_s(prompt,
output). Traces carry no completion times, so offline the service time is a
model (injectable; LinearServiceModel by default); the live system passes the
real completion time instead. Every time is in seconds from the trace start.

What linking misses, and what that does to labels: a request whose prompt
has a single block (and a first turn whose second block was still partial,
so its later turns carry a different id there) cannot be linked to its
conversation (see speckv.services.common.traces.mooncake). Such a turn sits
alone in a family, its record has next_arrival_s None, and its true return
becomes the turn 0 of a "new" conversation. Labels are then biased toward
"never returns" (the base rate is an underestimate) and turn indices toward
0; nothing is invented, so the bias only ever removes returns. (The Mooncake
conversation trace has no one-block request: every prompt spans >= 2 blocks.)
Conversations already under way when the trace starts are equally seen from
their first turn inside the trace (left truncation): their turn index is too
small.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

from speckv.services.common.traces.records import TraceRequest

ServiceFn = Callable[[int, int], float]  # (prompt_tokens, output_tokens) -> seconds


@dataclass(frozen=True, slots=True)
class LinearServiceModel:
    """service_s = fixed_s + prefill_s_per_token * prompt + decode_s_per_token * output.

    Defaults: prefill 25 us a token (DESIGN.md: ~21-22 us a token for
    Llama-3-8B on an H100, plus a margin for a larger model), decode 20 ms a
    token (50 tokens/s for one stream), no fixed cost; queueing is ignored.
    A mean Mooncake conversation turn (12k prompt, 343 output tokens) takes
    ~7.2 s. Invariant: service_s >= fixed_s >= 0.
    """

    prefill_s_per_token: float = 25e-6
    decode_s_per_token: float = 0.02
    fixed_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("prefill_s_per_token", "decode_s_per_token", "fixed_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r}: must be finite and >= 0")

    def __call__(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.fixed_s + self.prefill_s_per_token * prompt_tokens + self.decode_s_per_token * output_tokens


DEFAULT_SERVICE = LinearServiceModel()


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One turn. Invariants: end_s >= arrival_s; turn_index counts the
    conversation's earlier turns in the data (0-based); next_arrival_s, when
    not None, is >= arrival_s (it may precede end_s when the service model
    overestimates: the turn is then `overlapped`, already returned when it
    ends)."""

    conversation: str
    turn_index: int
    arrival_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int
    next_arrival_s: float | None
    follow_ups: int = 0  # the request's announced follow-ups (TraceRequest.follow_ups): the signal feature

    @property
    def return_delay_s(self) -> float:
        """Seconds from this turn's end to the next turn's arrival; +inf when
        none is in the data; negative when overlapped."""
        return math.inf if self.next_arrival_s is None else self.next_arrival_s - self.end_s

    @property
    def overlapped(self) -> bool:
        """The next turn arrived at or before this one ended: at end_s the
        return is already known, so there is nothing to forecast."""
        return self.next_arrival_s is not None and self.next_arrival_s <= self.end_s


def build_turns(requests: Sequence[TraceRequest], service_s: ServiceFn = DEFAULT_SERVICE) -> list[TurnRecord]:
    """Turn records of every request, sorted by (end_s, arrival_s,
    conversation, turn_index). Requests
    of one family are that conversation's turns in arrival order (ties keep
    the input order, which load_mooncake keeps stable)."""
    by_conversation: dict[str, list[TraceRequest]] = defaultdict(list)
    for request in sorted(requests, key=lambda r: r.arrival_s):
        by_conversation[request.family].append(request)
    turns: list[TurnRecord] = []
    for conversation, chain in by_conversation.items():
        for index, request in enumerate(chain):
            service = float(service_s(request.prompt_tokens, request.output_tokens))
            if not (math.isfinite(service) and service >= 0):
                raise ValueError(f"service_s({request.prompt_tokens}, {request.output_tokens}) = {service!r}: "
                                 "must be finite and >= 0")
            following = chain[index + 1].arrival_s if index + 1 < len(chain) else None
            turns.append(TurnRecord(conversation, index, request.arrival_s, request.arrival_s + service,
                                    request.prompt_tokens, request.output_tokens, following, request.follow_ups))
    turns.sort(key=lambda t: (t.end_s, t.arrival_s, t.conversation, t.turn_index))
    return turns
