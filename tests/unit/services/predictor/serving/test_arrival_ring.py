"""ArrivalSeries: bucketing, ring wrap, late and too-old observations, idle families, growth."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.predictor.serving.arrival_ring import ArrivalPlacement, ArrivalSeries


def counts(series: ArrivalSeries, family: str, step: int) -> float:
    row = series.row_of(family)
    assert row >= 0, f"{family} not tracked"
    got, _ = series.count_in_step(np.array([row]), step)
    return float(got[0])


@pytest.mark.parametrize("step_s", [0.25, 1.0, 2.0])
def test_observations_fall_in_the_step_of_their_time(step_s: float) -> None:
    series = ArrivalSeries(step_s, window_steps=8)
    for t in (0.0, 0.2 * step_s, 0.99 * step_s, 1.0 * step_s, 2.5 * step_s):
        assert series.add("f", t) is not ArrivalPlacement.TOO_OLD
    assert counts(series, "f", 0) == 3
    assert counts(series, "f", 1) == 1
    assert counts(series, "f", 2) == 1
    assert series.head_step == 2
    assert series.latest_time_s == pytest.approx(2.5 * step_s)


def test_ring_wraps_and_keeps_only_the_last_window() -> None:
    series = ArrivalSeries(1.0, window_steps=4)
    for step in range(10):
        for _ in range(step + 1):
            series.add("f", step + 0.5)
    assert series.head_step == 9
    assert sorted(series.column_steps().tolist()) == [6, 7, 8, 9]
    for step in range(6):
        assert counts(series, "f", step) == 0  # left the window
    for step in range(6, 10):
        assert counts(series, "f", step) == step + 1
    _, total = series.count_in_step(np.zeros(0, dtype=np.int64), 9)
    assert total == 10


def test_late_observation_in_window_is_counted_and_too_old_is_rejected() -> None:
    series = ArrivalSeries(1.0, window_steps=4)
    assert series.add("f", 10.2) is ArrivalPlacement.COUNTED
    assert series.add("f", 8.9) is ArrivalPlacement.COUNTED_LATE  # step 8 is in (6, 10]
    assert series.add("f", 6.9) is ArrivalPlacement.TOO_OLD  # step 6 is not
    assert counts(series, "f", 8) == 1
    assert counts(series, "f", 10) == 1
    assert series.origin_step == 8
    assert series.latest_time_s == 10.2


def test_a_jump_longer_than_the_window_clears_everything() -> None:
    series = ArrivalSeries(1.0, window_steps=4)
    series.add("old", 1.0)
    series.add("new", 100.0)
    assert series.row_of("old") == -1
    assert counts(series, "new", 100) == 1
    assert np.count_nonzero(series.column_steps() > 96) == 4
    _, total = series.count_in_step(np.zeros(0, dtype=np.int64), 100)
    assert total == 1


def test_idle_families_are_forgotten_and_their_rows_reused_clean() -> None:
    series = ArrivalSeries(1.0, window_steps=4, initial_rows=2)
    series.add("idle", 0.5)
    series.add("busy", 0.5)
    for step in range(1, 5):
        series.add("busy", step + 0.5)
    assert series.row_of("idle") == -1  # its only arrival (step 0) left the window at head 4
    assert series.families_tracked == 1
    series.add("fresh", 4.5)
    row = series.row_of("fresh")
    weights = np.ones(series.window_steps)
    assert series.weighted_sums(np.array([row]), weights)[0] == 1.0


def test_rows_grow_by_doubling_without_losing_counts() -> None:
    series = ArrivalSeries(1.0, window_steps=4, initial_rows=2)
    for i in range(100):
        for _ in range(i % 7 + 1):
            series.add(f"f{i}", 3.0)
    assert series.capacity == 128
    families, rows = series.tracked()
    assert len(families) == 100
    sums = series.weighted_sums(series.rows_of([f"f{i}" for i in range(100)]), np.ones(4))
    np.testing.assert_array_equal(sums, [i % 7 + 1 for i in range(100)])
    assert series.rows_of(["nope"]).tolist() == [-1]


def test_total_is_the_sum_over_families() -> None:
    rng = np.random.default_rng(3)
    series = ArrivalSeries(1.0, window_steps=16)
    for t, f in zip(np.sort(rng.uniform(0, 40, 2000)), rng.integers(0, 30, 2000)):
        series.add(f"f{f}", float(t))
    weights = rng.uniform(0, 1, 16)
    _, rows = series.tracked()
    assert series.weighted_total(weights) == pytest.approx(series.weighted_sums(rows, weights).sum(), rel=1e-5)


@pytest.mark.parametrize("step_s, window_steps", [(0.0, 4), (-1.0, 4), (float("nan"), 4), (1.0, 1)])
def test_bad_shapes_are_refused(step_s: float, window_steps: int) -> None:
    with pytest.raises(ValueError):
        ArrivalSeries(step_s, window_steps)


def dense_sums(series: ArrivalSeries, weights: np.ndarray) -> np.ndarray:
    """counts @ weights from the ring's columns, in float64 (the reference)."""
    out = np.zeros(series.capacity)
    if series.head_step is None:
        return out
    for step in range(series.head_step - series.window_steps + 1, series.head_step + 1):
        column, _ = series.column(step)
        out += column * weights[step % series.window_steps]
    return out


def fed_series(seed: int, late_fraction: float, unit_counts: bool, check) -> ArrivalSeries:
    """6,000 random arrivals with window jumps, forgotten and reused rows and
    growing rows and log; check(series, rng) every 97 arrivals."""
    rng = np.random.default_rng(seed)
    series = ArrivalSeries(0.5, window_steps=8, initial_rows=2)
    t = 0.0
    for i in range(6000):
        t += float(rng.exponential(0.02)) + (30.0 if i % 1500 == 1499 else 0.0)  # now and then, a jump past the window
        when = t - float(rng.uniform(0, 5.0)) if rng.random() < late_fraction else t  # late, in the window or too old
        count = 1.0 if unit_counts else float(rng.integers(1, 3))
        series.add(f"f{rng.integers(0, 40 if i < 3000 else 300)}", max(0.0, when), count)
        if i % 97 == 0:
            check(series, rng)
    return series


# (late fraction, unit counts): the general path, and the log's two fast paths
# (steps in order: no window mask; every count 1: no multiply) alone and together.
LOG_SHAPES = [(0.1, False), (0.0, False), (0.1, True), (0.0, True)]


@pytest.mark.parametrize("late_fraction, unit_counts", LOG_SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_sums_over_the_arrival_log_equal_the_ring(seed: int, late_fraction: float,
                                                           unit_counts: bool) -> None:
    """The log's sums equal the ring's, and a row's sum has the same bits
    whichever rows are asked."""
    def check(series: ArrivalSeries, rng: np.random.Generator) -> None:
        weights = rng.uniform(0, 1, 8)
        _, rows = series.tracked()
        sums = series.weighted_sums(rows, weights)
        np.testing.assert_allclose(sums, dense_sums(series, weights)[rows], rtol=1e-12, atol=0)
        some = rows[::3]
        assert series.weighted_sums(some, weights).tobytes() == sums[::3].tobytes()

    series = fed_series(seed, late_fraction, unit_counts, check)
    assert series.capacity > 64  # the rows grew


@pytest.mark.parametrize("late_fraction, unit_counts", LOG_SHAPES)
def test_the_log_fast_paths_give_the_general_paths_bits(late_fraction: float, unit_counts: bool) -> None:
    """Where the fast paths apply, turning them off (mask every entry by its
    step, multiply by every count) gives the same bits; where they do not,
    the series has them off."""
    def check(series: ArrivalSeries, rng: np.random.Generator) -> None:
        assert series._log_in_order or late_fraction > 0
        assert series._log_unit_counts or not unit_counts
        weights = rng.uniform(0, 1, 8)
        fast = series._log_product(weights)
        flags = series._log_in_order, series._log_unit_counts
        series._log_in_order = series._log_unit_counts = False
        general = series._log_product(weights)
        series._log_in_order, series._log_unit_counts = flags
        assert fast.tobytes() == general.tobytes()

    fed_series(5, late_fraction, unit_counts, check)


def test_the_arrival_log_grows_past_its_first_size_and_keeps_every_entry() -> None:
    series = ArrivalSeries(1.0, window_steps=4)
    for i in range(5000):  # far more entries in the window than the log's first 1,024
        series.add(f"f{i % 7}", 2.0 + (i % 3))
    weights = np.array([1.0, 10.0, 100.0, 1000.0])
    _, rows = series.tracked()
    np.testing.assert_array_equal(series.weighted_sums(rows, weights), dense_sums(series, weights)[rows])
    assert series.weighted_sums(rows, weights).sum() == sum(weights[(2 + i % 3) % 4] for i in range(5000))
