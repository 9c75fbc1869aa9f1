"""Whether a vLLM engine is alive, from the outcomes of periodic health probes.

vLLM's KV event publisher sends no heartbeat: an engine whose process died
(its prefix cache gone; a restarted one is empty) says nothing on its event
stream. A node whose kvstore stays up (`--kv-events ...,kvstore=1`) is kept
alive by that kvstore, so without a probe the engine's blocks would stay
indexed and Route would keep sending returning prompts there for a prefix
hit that no longer exists. The adapter (vllm_health.py) probes the engine's
OpenAI server (`GET /health`: 200 while the server and its engine core run,
503 once vLLM declared the engine dead, nothing at all once the process is
gone) and tells this state machine each outcome.

States and rules (one machine per engine; not thread-safe: one thread owns it):
- UNKNOWN: no probe has answered yet. Acts as alive (the engine's events are
  applied, as without a probe), so a scheduler that starts before its
  engines keeps today's behaviour until the first answer.
- ALIVE: the last probe answered.
- SUSPECT: 1 .. failures-1 consecutive probes failed; still acts as alive
  (a slow answer under load is not a death).
- DEAD: `failures` consecutive probes failed (from any state, UNKNOWN
  included: an engine that never answers is not served). The transition
  into DEAD is reported once (DIED): the caller drops the engine's blocks.
- A probe that answers in DEAD moves to ALIVE and reports REVIVED once: the
  engine comes back empty (a restarted process), its events repopulate it.
Probes are due every `interval_s` seconds of the injected clock, counted
from the previous probe's outcome; `deaths` and `revivals` count
transitions since construction.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from speckv.services.common.clock import Clock


class Health(enum.Enum):
    UNKNOWN = "unknown"
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"

    @property
    def served(self) -> bool:
        """Whether the engine's blocks are indexed and its node routed to."""
        return self is not Health.DEAD


class Transition(enum.Enum):
    NONE = "none"
    DIED = "died"  # entered DEAD: drop the engine's blocks
    REVIVED = "revived"  # left DEAD: the engine is back, empty


@dataclass(frozen=True, slots=True)
class LivenessRule:
    """Units: seconds."""

    interval_s: float = 1.0  # between two probes
    timeout_s: float = 2.0  # one probe's deadline (the adapter applies it; a later answer is a failure)
    failures: int = 3  # consecutive failed probes that make the engine dead

    def __post_init__(self) -> None:
        if not self.interval_s > 0 or not self.timeout_s > 0:
            raise ValueError(f"engine health: interval_s={self.interval_s} and timeout_s={self.timeout_s} "
                             "must be > 0")
        if self.failures < 1:
            raise ValueError(f"engine health: failures={self.failures} must be >= 1")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one recorded probe did to the machine."""

    transition: Transition
    health: Health
    failures: int  # consecutive failed probes, this one included (0 after an answer)
    silent_s: float  # seconds since the last answer (since construction if none came); 0 after an answer
    ever_answered: bool  # whether any probe has answered (DIED without one: it never came up)


class EngineLiveness:
    """The state machine of the module docstring, on an injected clock."""

    __slots__ = ("rule", "_clock", "_health", "_failures", "_last_answer", "_ever_answered", "_next_probe",
                 "deaths", "revivals")

    def __init__(self, rule: LivenessRule, clock: Clock) -> None:
        self.rule = rule
        self._clock = clock
        self._health = Health.UNKNOWN
        self._failures = 0
        self._last_answer = clock.now()  # construction stands in until the first answer
        self._ever_answered = False
        self._next_probe = clock.now()  # the first probe is due at once
        self.deaths = 0
        self.revivals = 0

    @property
    def health(self) -> Health:
        return self._health

    def wait_s(self) -> float:
        """Seconds until the next probe is due (0: now)."""
        return max(0.0, self._next_probe - self._clock.now())

    def record(self, answered: bool) -> Outcome:
        """One probe's outcome: answered = the engine said it is healthy within the timeout."""
        now = self._clock.now()
        self._next_probe = now + self.rule.interval_s
        if answered:
            revived = self._health is Health.DEAD
            self._health, self._failures, self._last_answer, self._ever_answered = Health.ALIVE, 0, now, True
            if revived:
                self.revivals += 1
            return Outcome(Transition.REVIVED if revived else Transition.NONE, self._health, 0, 0.0, True)
        self._failures += 1
        transition = Transition.NONE
        if self._health is not Health.DEAD and self._failures >= self.rule.failures:
            self._health, transition = Health.DEAD, Transition.DIED
            self.deaths += 1
        elif self._health is Health.ALIVE:
            self._health = Health.SUSPECT
        return Outcome(transition, self._health, self._failures, now - self._last_answer, self._ever_answered)
