"""Hard-to-break limits of the predictor core (issue 22, item 5): now_s
within max_clock_skew_s of the clock, the family cap (least recently seen
dropped first, rows reused clean), and the reload probe process."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.config import parse_config
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.serving.arrival_ring import ArrivalSeries
from speckv.services.predictor.serving.core import PredictorCore, PredictorSettings
from speckv.services.predictor.serving.count_models import EwmaModel, EwmaParams
from speckv.services.predictor.serving.manifest import write_manifest
from speckv.services.predictor.serving.model_reload import reload_model
from speckv.services.predictor.serving.observations import Arrival
from speckv.services.predictor.serving.sandbox import probe_model

NOW = 10_000.0


def make_core(clock: ManualClock, **settings) -> PredictorCore:
    return PredictorCore(clock, EwmaModel(EwmaParams(version="v1")), PredictorSettings(**settings))


# --- now_s against the clock ---------------------------------------------------

@pytest.mark.parametrize("now_s", [NOW + 1e6, NOW + 301.0, NOW - 301.0, 1.0])
def test_now_far_from_the_clock_is_refused(now_s: float) -> None:
    core = make_core(ManualClock(NOW))
    with pytest.raises(InvalidArgument, match="max_clock_skew_s"):
        core.forecast(["f"], now_s=now_s)
    with pytest.raises(InvalidArgument, match="max_clock_skew_s"):
        core.top_families(3, now_s=now_s)


def test_now_within_the_skew_is_served_and_zero_skew_is_no_limit() -> None:
    core = make_core(ManualClock(NOW))
    assert core.forecast(["f"], now_s=NOW + 299.0).now_s == NOW + 299.0
    assert core.forecast(["f"], now_s=NOW - 299.0).now_s == NOW - 299.0
    free = make_core(ManualClock(NOW), max_clock_skew_s=0.0)
    assert free.forecast(["f"], now_s=NOW + 1e6).now_s == NOW + 1e6


def test_a_refused_far_future_forecast_leaves_later_forecasts_unchanged() -> None:
    clock = ManualClock(NOW)
    core = make_core(clock)
    core.observe([Arrival(float(t), "f") for t in np.arange(NOW - 300, NOW, 0.5)])
    before = core.forecast(["f"]).expected.copy()
    with pytest.raises(InvalidArgument):
        core.forecast(["f"], now_s=NOW + 1e6)
    np.testing.assert_array_equal(core.forecast(["f"]).expected, before)
    assert before[0, 0] > 1.0  # about 2 a second, not the prior of an unknown family


@pytest.mark.parametrize("field, value", [("max_clock_skew_s", -1.0), ("max_clock_skew_s", float("inf")),
                                          ("max_families_tracked", -1), ("reload_probe_timeout_s", 0.0)])
def test_limits_are_validated(field: str, value: float) -> None:
    with pytest.raises(InvalidArgument, match=field):
        PredictorSettings(**{field: value}).validate()


def test_limits_are_config_fields() -> None:
    config = parse_config(PredictorConfig, ["--max-clock-skew-s", "30", "--max-families-tracked", "50",
                                            "--reload-probe-timeout-s", "5"], {}, prog="p")
    settings = config.core_settings()
    assert (settings.max_clock_skew_s, settings.max_families_tracked, settings.reload_probe_timeout_s) == (30, 50, 5)
    assert PredictorConfig().core_settings().max_families_tracked == 1_000_000
    root = parse_config(PredictorConfig, [], {"SPECKV_MODEL_ROOT": "/models"}, prog="p").core_settings().model_root
    assert (root, PredictorConfig().core_settings().model_root) == ("/models", "")  # empty: no reloads
    with pytest.raises(InvalidArgument, match="model_root"):
        PredictorSettings(model_root="/m\x00").validate()


# --- the family cap ---------------------------------------------------------------

def test_the_family_cap_holds_and_drops_the_least_recently_seen_first() -> None:
    clock = ManualClock(NOW)
    core = make_core(clock, max_families_tracked=100)
    for i in range(5_000):
        t = NOW - 500 + i * 0.1
        core.observe([Arrival(t, f"f{i}"), Arrival(t, "always")])  # "always" is seen with every new family
        assert core.families_tracked == min(i + 2, 100)
    tracked = set(core.tracked_families())
    newest = {f"f{i}" for i in range(5_000 - 99, 5_000)}
    assert tracked == newest | {"always"}  # exactly the 99 newest and the one seen every time
    assert core.families_dropped == 5_000 + 1 - 100
    assert core.forecast(["always"]).known[0] and not core.forecast(["f0"]).known[0]


def cap_series(cap: int) -> ArrivalSeries:
    return ArrivalSeries(1.0, 60, initial_rows=2, max_families=cap)


@pytest.mark.parametrize("cap", [1, 2, 5, 64])
def test_the_cap_is_exact_n_families_fit_and_the_next_drops_the_oldest_seen(cap: int) -> None:
    """Fails when the cap moves by one either way: cap families are all kept
    (none dropped), cap + 1 leave cap, the first seen gone."""
    series = cap_series(cap)
    for i in range(cap):
        series.add(f"f{i}", 10.0 + 0.01 * i)
    assert (series.families_tracked, series.evicted) == (cap, 0)
    assert all(series.row_of(f"f{i}") >= 0 for i in range(cap))
    series.add("new", 11.0)
    assert (series.families_tracked, series.evicted) == (cap, 1)
    assert series.row_of("f0") == -1 and series.row_of("new") >= 0
    assert all(series.row_of(f"f{i}") >= 0 for i in range(1, cap))


def test_a_family_seen_again_is_kept_and_the_next_least_recent_goes() -> None:
    series = cap_series(3)
    for name in ("a", "b", "c"):
        series.add(name, 10.0)
    series.add("a", 10.5)  # a is now the most recently seen: b is the oldest
    series.add("d", 11.0)
    assert series.row_of("a") >= 0 and series.row_of("b") == -1
    series.add("c", 5.0)  # a late observation is a sighting too: a is now the oldest
    series.add("e", 11.0)
    assert series.row_of("a") == -1 and {f for f in series.tracked()[0]} == {"c", "d", "e"}


def test_a_dropped_familys_forecast_is_a_never_seen_familys() -> None:
    clock = ManualClock(NOW)
    core = make_core(clock, max_families_tracked=3)
    core.observe([Arrival(float(t), "hot") for t in np.arange(NOW - 300, NOW - 100, 0.5)])
    core.observe([Arrival(NOW - 50.0, name) for name in ("b", "c", "d")])  # hot, the least recently seen, goes
    assert core.families_dropped == 1 and "hot" not in core.tracked_families()
    result = core.forecast(["hot", "never-seen"])
    assert not result.known.any()
    for array in (result.expected, result.upper, result.burst_probability):
        np.testing.assert_array_equal(array[0], array[1])


def test_a_row_freed_at_the_cap_is_reused_without_the_old_familys_counts() -> None:
    series = ArrivalSeries(1.0, 600, initial_rows=4, max_families=4)
    for f in range(4):
        for t in range(50):
            series.add(f"old{f}", 100.0 + t + 0.01 * f)  # 50 arrivals each, old0 seen least recently
    ones = np.ones(600)
    assert series.weighted_sums(np.array([series.row_of("old0")]), ones)[0] == 50.0
    series.add("new", 160.0)  # evicts old0, exactly
    assert series.families_tracked == 4 and series.row_of("old0") == -1 and series.evicted == 1
    row = series.row_of("new")
    series.add("new", 160.5)  # its own entries, logged after the eviction, count
    assert series.weighted_sums(np.array([row]), ones)[0] == 2.0  # not 52: the old family's log entries are gone
    assert series.count_in_step(np.array([row]), 160)[0][0] == 2.0
    assert series.weighted_sums(np.array([series.row_of("old3")]), ones)[0] == 50.0


def test_a_row_evicted_twice_before_a_read_keeps_only_its_newest_familys_entries() -> None:
    series = ArrivalSeries(1.0, 600, initial_rows=2, max_families=2)
    series.add("a", 100.0)
    series.add("b", 100.0)
    series.add("c", 101.0)  # a's row goes to c
    series.add("c", 101.5)
    series.add("d", 102.0)  # b's row goes to d
    series.add("e", 103.0)  # c's row (a's before) goes to e
    rows = np.array([series.row_of("d"), series.row_of("e")])
    np.testing.assert_array_equal(series.weighted_sums(rows, np.ones(600)), [1.0, 1.0])
    for i in range(2_000):  # enough entries to compact the log, evicting all the way
        series.add(f"g{i}", 104.0 + i * 0.01)
    rows = np.array([series.row_of("g1998"), series.row_of("g1999")])
    np.testing.assert_array_equal(series.weighted_sums(rows, np.ones(600)), [1.0, 1.0])


@pytest.mark.parametrize("raw", ["-1", "abc", "1.5"])
def test_a_bad_cap_is_refused_naming_the_field(raw: str) -> None:
    with pytest.raises(InvalidArgument, match="max.families.tracked"):
        parse_config(PredictorConfig, ["--max-families-tracked", raw], {}, prog="p").validate()


def test_no_cap_means_unbounded() -> None:
    series = ArrivalSeries(1.0, 60, max_families=0)
    for f in range(1_000):
        series.add(f"f{f}", 10.0)
    assert series.families_tracked == 1_000 and series.evicted == 0


# --- the reload probe -----------------------------------------------------------

def test_probe_passes_a_good_model_and_reports_domain_errors_as_such(tmp_path: Path) -> None:
    write_manifest(tmp_path / "good", {"kind": "ewma", "version": "v2", "horizons_s": [1], "quantile": 0.5})
    probe_model(tmp_path / "good", timeout_s=60.0)
    write_manifest(tmp_path / "bad", {"kind": "ewma", "version": "v2", "horizons_s": [1], "quantile": 7})
    with pytest.raises(InvalidArgument, match="quantile"):
        probe_model(tmp_path / "bad", timeout_s=60.0)
    with pytest.raises(NotFound):
        probe_model(tmp_path / "absent", timeout_s=60.0)


def test_probe_timeout_is_a_refused_reload_and_the_old_model_stays(tmp_path: Path) -> None:
    write_manifest(tmp_path / "good", {"kind": "ewma", "version": "v2", "horizons_s": [1], "quantile": 0.5})
    core = make_core(ManualClock(NOW), reload_probe_timeout_s=0.001,  # no interpreter starts that fast
                     model_root=str(tmp_path))
    with pytest.raises(FailedPrecondition, match="within"):
        reload_model(core, "good")
    assert core.model_info().version == "v1"


def test_wrongly_typed_manifest_values_are_refused_not_internal(tmp_path: Path) -> None:
    core = make_core(ManualClock(NOW), model_root=str(tmp_path))
    write_manifest(tmp_path / "lgbm", {"kind": "lightgbm", "version": "x", "horizons_s": [1], "quantile": 0.5,
                                        "features": 5, "feature_spec": {}, "alarm_threshold": [0.5],
                                        "dispersion": [0], "offset": {}, "trace": "", "files": {}})
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    for name in ("lgbm", "deep"):
        with pytest.raises((InvalidArgument, FailedPrecondition)):
            reload_model(core, name)
    with pytest.raises(InvalidArgument, match="name="):
        reload_model(core, "a" * 5_000)
    assert core.model_info().version == "v1"


def test_a_manifest_symlinked_out_of_its_directory_is_refused(tmp_path: Path) -> None:
    """The model directory is under the root; its manifest.json leads out of it."""
    outside = tmp_path / "outside"
    write_manifest(outside, {"kind": "ewma", "version": "outside", "horizons_s": [1.0], "quantile": 0.9,
                             "features": [], "params": {"halflife_s": 5.0, "dispersion": 0.0}})
    root = tmp_path / "root"
    (root / "sneaky").mkdir(parents=True)
    (root / "sneaky" / "manifest.json").symlink_to(outside / "manifest.json")
    core = make_core(ManualClock(NOW), model_root=str(root))
    with pytest.raises(InvalidArgument, match="outside the model directory"):
        reload_model(core, "sneaky")
    assert core.model_info().version == "v1"
