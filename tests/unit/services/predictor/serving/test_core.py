"""PredictorCore: observation validation, forecast limits, vectorised forecasts, model swaps."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument, NotFound
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.serving.core import PredictorCore, PredictorSettings
from speckv.services.predictor.serving.count_models import EwmaModel, EwmaParams
from speckv.services.predictor.serving.manifest import write_manifest
from speckv.services.predictor.serving.model_reload import reload_model
from speckv.services.predictor.serving.observations import Arrival

NOW = 1000.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def core(clock: ManualClock) -> PredictorCore:
    return PredictorCore(clock, EwmaModel(EwmaParams(version="v1")), PredictorSettings(max_families_per_call=20_000))


def steady(family: str, rate: float, start: float, end: float) -> list[Arrival]:
    return [Arrival(float(t), family) for t in np.arange(start, end, 1.0 / rate)]


@pytest.mark.parametrize("arrival, reason", [
    (Arrival(NOW, ""), "empty_family"),
    (Arrival(NOW, "x" * 2000), "family_too_long"),
    (Arrival(float("nan"), "f"), "bad_time"),
    (Arrival(float("inf"), "f"), "bad_time"),
    (Arrival(-1.0, "f"), "bad_time"),
    (Arrival(NOW, "f", prompt_tokens=-5), "bad_tokens"),
    (Arrival(NOW, "f", prompt_tokens=10, cached_tokens=11), "bad_tokens"),
    (Arrival(NOW + 3600, "f"), "from_future"),
    (Arrival(NOW - 700, "f"), "too_old"),
])
def test_bad_observations_are_rejected_one_by_one_with_a_counted_reason(
        core: PredictorCore, arrival: Arrival, reason: str) -> None:
    result = core.observe([Arrival(NOW - 1, "good"), arrival, Arrival(NOW - 0.5, "good"), arrival])
    assert (result.accepted, result.rejected) == (2, 2)
    assert result.first_error
    counters = core.counters()
    assert counters[f"rejected_{reason}"] == 2 and counters["accepted"] == 2


def test_late_in_window_observations_count(core: PredictorCore) -> None:
    core.observe([Arrival(NOW, "f")])
    result = core.observe([Arrival(NOW - 500, "f")])
    assert result.accepted == 1 and core.counters()["late"] == 1


@pytest.mark.parametrize("horizons", [[0.0], [-1.0], [float("nan")], [601.0], [1.0] * 65])
def test_bad_horizons_are_invalid(core: PredictorCore, horizons: list[float]) -> None:
    with pytest.raises(InvalidArgument, match="horizons_s"):
        core.forecast(["f"], horizons)


@pytest.mark.parametrize("families, match", [([""], r"families\[0\]"), (["a", ""], r"families\[1\]"),
                                             (["f"] * 20_001, "at most")])
def test_bad_family_lists_are_invalid(core: PredictorCore, families: list[str], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        core.forecast(families)


@pytest.mark.parametrize("now", [-1.0, float("inf")])
def test_bad_now_is_invalid(core: PredictorCore, now: float) -> None:
    with pytest.raises(InvalidArgument, match="now_s"):
        core.forecast(["f"], now_s=now)


def test_forecast_for_ten_thousand_families_returns_one_row_each(core: PredictorCore) -> None:
    rng = np.random.default_rng(0)
    seen = [f"fam-{i}" for i in range(10_000)]
    times = np.sort(rng.uniform(NOW - 120, NOW, 50_000))
    core.observe(Arrival(float(t), seen[i]) for t, i in zip(times, rng.integers(0, 10_000, 50_000)))
    asked = seen[::-1] + ["unseen-1", "unseen-2"]
    result = core.forecast(asked)
    assert result.families == asked
    assert result.expected.shape == result.upper.shape == result.burst_probability.shape == (10_002, 4)
    tracked = core.model_info().families_tracked
    assert int(result.known.sum()) == tracked and not result.known[-2:].any()
    assert np.isfinite(result.expected).all() and (result.upper >= np.floor(result.expected)).all()
    assert ((0 <= result.burst_probability) & (result.burst_probability <= 1)).all()


def test_top_families_ranks_by_expected_count(core: PredictorCore) -> None:
    core.observe(sorted(steady("hot", 8, NOW - 60, NOW) + steady("warm", 2, NOW - 60, NOW)
                        + steady("cold", 0.2, NOW - 60, NOW), key=lambda a: a.time_s))
    top = core.top_families(2)
    assert top.families == ["hot", "warm"]
    assert top.expected[0, 0] > top.expected[1, 0]
    assert core.forecast([], max_families=0).families == ["hot", "warm", "cold"]
    with pytest.raises(InvalidArgument):
        core.top_families(0)


def test_now_defaults_to_the_clock_and_is_clamped_to_the_newest_observation(
        core: PredictorCore, clock: ManualClock) -> None:
    core.observe([Arrival(NOW + 10, "f")])
    assert core.forecast(["f"]).now_s == NOW + 10  # the clock says NOW
    clock.advance(20)
    assert core.forecast(["f"]).now_s == NOW + 20
    assert core.forecast(["f"], now_s=NOW + 5).now_s == NOW + 10  # an earlier now_s is clamped up too


def test_model_info_reports_the_serving_model(core: PredictorCore) -> None:
    core.observe(steady("f", 1, NOW - 5, NOW))
    info = core.model_info()
    assert (info.name, info.version, info.source, info.loaded_at_s) == ("ewma", "v1", "builtin", NOW)
    assert (info.families_tracked, info.observations_total) == (1, 5)
    assert "long_halflife_s=120" in info.burst_definition


def test_good_reload_swaps_and_failed_reload_keeps_the_old_model(clock: ManualClock, tmp_path: Path) -> None:
    write_manifest(tmp_path / "good", {"kind": "last-value", "version": "lv-2", "horizons_s": [1, 3],
                                        "quantile": 0.5, "metrics": {"mae_1s": 0.5}})
    write_manifest(tmp_path / "bad", {"kind": "ewma", "version": "v9", "horizons_s": [1], "quantile": 7})
    write_manifest(tmp_path / "too-slow", {"kind": "ewma", "version": "v9", "horizons_s": [1], "quantile": 0.5,
                                            "long_halflife_s": 1000})
    clock.advance(5)
    core = PredictorCore(clock, EwmaModel(EwmaParams(version="v1")), PredictorSettings(model_root=str(tmp_path)))
    info = reload_model(core, "good")
    assert (info.name, info.version, info.horizons_s, info.loaded_at_s) == ("last-value", "lv-2", (1.0, 3.0), NOW + 5)
    assert info.source == os.path.realpath(tmp_path / "good") and info.metrics == {"mae_1s": 0.5}
    with pytest.raises(InvalidArgument, match="quantile"):
        reload_model(core, "bad")
    with pytest.raises(InvalidArgument, match="window_s"):
        reload_model(core, "too-slow")
    with pytest.raises(NotFound):
        reload_model(core, "absent")
    assert core.model_info().version == "lv-2"
    assert core.forecast(["f"]).model_version == "lv-2"


def test_concurrent_observers_and_forecasters_lose_nothing(core: PredictorCore) -> None:
    errors: list[BaseException] = []

    def observer(i: int) -> None:
        try:
            for k in range(20):
                core.observe([Arrival(NOW - 10 + k * 0.1, f"f{i}-{j}") for j in range(50)])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def forecaster() -> None:
        try:
            for _ in range(20):
                core.forecast([], max_families=10)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=observer, args=(i,)) for i in range(4)] + [threading.Thread(target=forecaster)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert core.counters()["accepted"] == 4 * 20 * 50
    assert core.model_info().families_tracked == 4 * 50


@pytest.mark.parametrize("argv, field", [
    (["--step-s", "0"], "step_s"),
    (["--window-s", "10.5"], "window_s"),
    (["--horizons", "1,x"], "horizons"),
    (["--horizons", "5,1"], "horizons"),
    (["--horizons", "1,700"], "horizons"),
    (["--quantile", "1"], "quantile"),
    (["--halflife-s", "-3"], "halflife_s"),
    (["--burst-ratio", "0.5"], "burst_ratio"),
    (["--long-halflife-s", "400"], "long_halflife_s"),
    (["--max-families-per-call", "0"], "max_families_per_call"),
    (["--max-future-s", "-1"], "max_future_s"),
])
def test_config_validation_names_the_field(argv: list[str], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        parse_config(PredictorConfig, argv, {}, prog="speckv predictor")


def test_config_reads_flags_and_environment() -> None:
    config = parse_config(PredictorConfig, ["--halflife-s", "5"], {"SPECKV_HORIZONS": "1,30"}, prog="p")
    model = config.builtin_model()
    assert model.params.halflife_s == 5.0 and model.horizons_s == (1.0, 30.0)
