"""Session returns in the simulator, offline, online or both (issue 45,
item 1): what the Simulation feeds every arrival and turn end, and the
forecast sources the planner reads.

- Offline (the default; `--returns on`): the model trained before the slice
  (returns.py), served from the start; nothing is refitted. Exactly the
  simulator as it was: no fitter exists.
- Online (`--online-learning on`): an OnlineReturnFitter
  (services/predictor/fitting/returns/online.py, the same core the live
  predictor runs) takes the same arrivals and turn ends in virtual time. The
  Simulation calls tick(now) every FIT_CHECK_S of virtual time; a due fit runs
  there, synchronously, at that virtual time, so a run is deterministic
  (LightGBM seeded, one thread). With an offline model it is the warm start;
  without one (a replay from the trace's first arrival) nothing is served
  until the first fit, and the tracker is created then, warmed from the
  fitter's log (every arrival and turn end it holds, in time order).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from speckv.services.common.clock import Clock
from speckv.services.predictor.fitting.returns.config import ReturnConfig
from speckv.services.predictor.fitting.returns.online import FitOutcome, FitRecord, FitResult, OnlineReturnFitter
from speckv.services.predictor.fitting.returns.turns import TurnRecord
from speckv.services.predictor.serving.returns.model import ReturnModel
from speckv.services.predictor.serving.returns.tracker import ReturnTracker
from speckv.loadgen.sim.returns import TrackerSlot, TrainedReturns

FIT_CHECK_S = 10.0  # virtual seconds between checks whether a fit is due (a check is O(1))


@dataclass(slots=True)
class SimReturns:
    """The tracker slot the forecast sources read, fed by the Simulation; with
    a fitter, learning online (module docstring)."""

    config: ReturnConfig
    slot: TrackerSlot
    fitter: OnlineReturnFitter | None = None
    fits: list[tuple[float, FitResult]] = field(default_factory=list)

    @classmethod
    def build(cls, config: ReturnConfig, clock: Clock, trained: TrainedReturns | None, online: bool) -> "SimReturns":
        slot = TrackerSlot(trained.tracker() if trained is not None else None)
        fitter = (OnlineReturnFitter(config, config.online, clock, trained.model if trained else None,
                                     "offline warm start") if online else None)
        return cls(config, slot, fitter)

    def arrival(self, conversation: str, now: float, prompt_tokens: int = 0) -> None:
        if self.slot.tracker is not None:
            self.slot.tracker.arrival(conversation, now, prompt_tokens)
        if self.fitter is not None:
            self.fitter.arrival(conversation, now, prompt_tokens)

    def turn_end(self, conversation: str, now: float, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 follow_ups: float = 0.0) -> None:
        if self.slot.tracker is not None:
            self.slot.tracker.turn_end(conversation, now, arrival_s, prompt_tokens, output_tokens, follow_ups)
        if self.fitter is not None:
            self.fitter.turn_end(conversation, now, arrival_s, prompt_tokens, output_tokens, follow_ups)

    def tick(self, now: float) -> None:
        """Runs a due fit now (virtual time) and serves what it validated."""
        if self.fitter is None or not self.fitter.due(now):
            return
        result = self.fitter.fit_now(now)
        self.fits.append((now, result))
        if result.outcome is FitOutcome.SERVED and result.model is not None:
            self._install(result.model)

    def _install(self, model: ReturnModel) -> None:
        if self.slot.tracker is not None:
            self.slot.tracker.set_model(model)
            return
        assert self.fitter is not None
        limits = self.config.tracker
        tracker = ReturnTracker(model, self.config.features, limits.max_open_conversations, limits.max_idle_s,
                                self.config.recalibration)
        turns, in_flight = self.fitter.replay()
        events: list[tuple[float, int, str, int, TurnRecord | None]] = [
            (t.arrival_s, 0, t.conversation, t.prompt_tokens, None) for t in turns]
        events += [(t.end_s, 1, t.conversation, t.prompt_tokens, t) for t in turns]
        events += [(time_s, 0, c, prompt, None) for c, time_s, prompt in in_flight]
        events.sort(key=lambda e: (e[0], e[1], e[2]))
        for time_s, kind, conversation, prompt, turn in events:
            if turn is None:
                tracker.arrival(conversation, time_s, prompt)
            else:
                tracker.turn_end(conversation, time_s, turn.arrival_s, turn.prompt_tokens, turn.output_tokens,
                                 float(turn.follow_ups))
        self.slot.tracker = tracker

    def note(self) -> str:
        """What online learning did over the run ("" without it)."""
        if self.fitter is None:
            return ""
        served: list[tuple[float, FitRecord]] = [(at, r.record) for at, r in self.fits
                                                 if r.outcome is FitOutcome.SERVED and r.record is not None]
        kept = sum(1 for _, r in self.fits if r.outcome is FitOutcome.KEPT)
        first = f"first served at {served[0][0]:.0f} s ({served[0][1].origin})" if served else "none served"
        last = served[-1][1] if served else None
        window = (f"; last served {last.version} trained on [{last.window_start_s:.0f}, {last.window_end_s:.0f}) s, "
                  f"held-out Brier {last.holdout_score:.4f} vs {last.replaced_score:.4f}") if last else ""
        return (f"online return learning: {len(self.fits)} fits, {len(served)} served, {kept} kept the served "
                f"model; {first}{window}")
