"""Configuration of the predictor process (flags --field-name, env SPECKV_FIELD_NAME)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.rpc.server import ServerSettings
from speckv.services.predictor.fitting.returns.config import TrackerLimits
from speckv.services.predictor.serving.core import PredictorSettings
from speckv.services.predictor.serving.count_models import HISTORY_HALFLIVES, EwmaModel, EwmaParams
from speckv.services.predictor.serving.returns.serving import ReturnsSettings


@dataclass(frozen=True, slots=True)
class PredictorConfig(ServerSettings):
    step_s: float = field(default=1.0, metadata={"help": "time step of the arrival series, seconds"})
    window_s: float = field(default=600.0, metadata={"help": "history kept per family, seconds (a whole number of steps)"})
    horizons: str = field(default="1,2,5,10", metadata={"help": "builtin model's forecast horizons, comma-separated seconds"})
    quantile: float = field(default=0.9, metadata={"help": "builtin model's upper quantile, in (0, 1)"})
    halflife_s: float = field(default=10.0, metadata={"help": "builtin EWMA rate half-life, seconds"})
    long_halflife_s: float = field(default=120.0, metadata={"help": "half-life of the slow EWMA that sets a family's burst threshold, seconds"})
    burst_ratio: float = field(default=3.0, metadata={"help": "a burst is more than burst_ratio x the family's long-run count over the horizon"})
    min_burst_count: float = field(default=5.0, metadata={"help": "a burst is never fewer arrivals than this over the horizon"})
    model_dir: str = field(default="", metadata={"help": "model directory with manifest.json to load at start (a path, relative to the working directory, anywhere: the operator's own choice); empty: builtin EWMA"})
    model_root: str = field(default="", metadata={"help": "directory whose direct subdirectories ReloadModel may load, by name (never a path; a symlink leading out of it is refused); empty: ReloadModel is FAILED_PRECONDITION"})
    max_families_per_call: int = field(default=100_000, metadata={"help": "most families one Forecast may name or return"})
    max_horizon_s: float = field(default=600.0, metadata={"help": "longest horizon a forecast may ask for, seconds"})
    retrain_interval_s: float = field(default=0.0, metadata={"help": "retrain LightGBM on the window every this many seconds in the background; 0: never"})
    retrain_dir: str = field(default="", metadata={"help": "directory for retrained model versions (required with retrain_interval_s)"})
    retrain_quick: bool = field(default=False, metadata={"help": "retrain with the quick hyperparameters of services/config/predictor.json"})
    max_future_s: float = field(default=60.0, metadata={"help": "refuse observations further than this ahead of the predictor's clock, seconds; 0: no limit"})
    max_clock_skew_s: float = field(default=300.0, metadata={"help": "refuse a forecast whose now_s is further than this from the predictor's clock (either way), seconds; 0: no limit"})
    # Far above the most any shipped simulation tracks (383,885: the conversation trace at 1,024 nodes;
    # docs/limits.md), so no committed figure meets the cap; a deployment sizes it to its memory (deploy/k8s).
    max_families_tracked: int = field(default=1_000_000, metadata={"help": "most families tracked at once; past it the least recently seen is dropped; 0: no cap"})
    reload_probe_timeout_s: float = field(default=60.0, metadata={"help": "a ReloadModel candidate must load and predict in a separate probe process within this, seconds"})
    returns_model: str = field(default="", metadata={"help": "session-return model directory (speckv bench returns --save DIR) that ForecastReturns serves; empty: none (ForecastReturns is FAILED_PRECONDITION)"})
    returns_warm: str = field(default="", metadata={"help": "JSONL of past turns (conversation, arrival_s, end_s, prompt_tokens, output_tokens on the predictor's clock) fed to the return tracker at start; needs returns_model"})
    online_learning: bool = field(default=False, metadata={"help": "the session-return model fits itself from the arrivals and turn ends received (thresholds: session_return.online in services/config/predictor.json), with --returns-model as its warm start where given; a worker thread fits off the forecast locks"})
    online_check_s: float = field(default=10.0, metadata={"help": "with online_learning: seconds between checks whether a fit is due"})
    retrain_min_arrivals: int = field(default=0, metadata={"help": "with retrain_interval_s: the count model's first fit also waits for this many arrivals in the window"})
    returns_arrival_match_s: float = field(default=1.0, metadata={"help": "a turn end's arrival_s is matched to the conversation's reported arrival within this, and an arrival this close to one already reported is the same one, seconds"})

    def validate(self) -> None:
        ServerSettings.validate(self)
        self.core_settings().validate()
        try:
            horizons = self.horizon_list()
        except ValueError:
            raise InvalidArgument(f"horizons={self.horizons!r}: expected comma-separated numbers, e.g. 1,2,5,10") from None
        if not all(0 < h <= self.max_horizon_s for h in horizons) or list(horizons) != sorted(set(horizons)):
            raise InvalidArgument(f"horizons={self.horizons!r}: must be strictly increasing, each > 0 and "
                                  f"<= max_horizon_s={self.max_horizon_s:g}")
        if not (math.isfinite(self.retrain_interval_s) and self.retrain_interval_s >= 0):
            raise InvalidArgument(f"retrain_interval_s={self.retrain_interval_s}: must be finite and >= 0")
        if self.retrain_interval_s > 0 and not self.retrain_dir:
            raise InvalidArgument("retrain_dir: required when retrain_interval_s > 0")
        if self.returns_warm and not self.returns_model:
            raise InvalidArgument("returns_warm: needs returns_model (nothing to warm without a return model)")
        if not (math.isfinite(self.online_check_s) and self.online_check_s > 0):
            raise InvalidArgument(f"online_check_s={self.online_check_s}: must be finite and > 0")
        if self.retrain_min_arrivals < 0:
            raise InvalidArgument(f"retrain_min_arrivals={self.retrain_min_arrivals}: must be >= 0")
        if not (math.isfinite(self.returns_arrival_match_s) and self.returns_arrival_match_s >= 0):
            raise InvalidArgument(f"returns_arrival_match_s={self.returns_arrival_match_s}: must be finite and >= 0")
        self.builtin_params().validate()  # names halflife_s, quantile, burst_ratio, ... on error
        slowest = max(self.halflife_s, self.long_halflife_s)
        if HISTORY_HALFLIVES * slowest > self.window_s:
            raise InvalidArgument(f"long_halflife_s={self.long_halflife_s:g}, halflife_s={self.halflife_s:g}: "
                                  f"window_s={self.window_s:g} must hold {HISTORY_HALFLIVES:g} half-lives")

    def horizon_list(self) -> tuple[float, ...]:
        """horizons parsed; raises ValueError when it is not a list of numbers."""
        values = tuple(float(part) for part in self.horizons.split(",") if part.strip())
        if not values or not all(math.isfinite(v) for v in values):
            raise ValueError(self.horizons)
        return values

    def core_settings(self) -> PredictorSettings:
        return PredictorSettings(step_s=self.step_s, window_s=self.window_s,
                            max_families_per_call=self.max_families_per_call,
                            max_horizon_s=self.max_horizon_s, max_future_s=self.max_future_s,
                            max_clock_skew_s=self.max_clock_skew_s, max_families_tracked=self.max_families_tracked,
                            reload_probe_timeout_s=self.reload_probe_timeout_s, model_root=self.model_root)

    def returns_settings(self, tracker: TrackerLimits, conversations_held: int) -> ReturnsSettings:
        """The served tracker's limits: its caps from the `session_return`
        section of services/config/predictor.json, the clock checks from ours."""
        return ReturnsSettings(max_open_conversations=tracker.max_open_conversations, max_idle_s=tracker.max_idle_s,
                               max_conversations_held=conversations_held, max_clock_skew_s=self.max_clock_skew_s,
                               max_future_s=self.max_future_s, arrival_match_s=self.returns_arrival_match_s)

    def builtin_params(self) -> EwmaParams:
        return EwmaParams(version="builtin-ewma", horizons_s=self.horizon_list(), quantile=self.quantile,
                          long_halflife_s=self.long_halflife_s, burst_ratio=self.burst_ratio,
                          min_burst_count=self.min_burst_count, halflife_s=self.halflife_s)

    def builtin_model(self) -> EwmaModel:
        return EwmaModel(self.builtin_params())
