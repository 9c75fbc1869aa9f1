from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.loadgen.profiles.fit import (
    LinearFit,
    alternate_split,
    attention_pair_ms,
    fit_held_out,
    fit_linear,
    relative_error,
)


def test_the_fit_recovers_known_coefficients_from_exact_points():
    sizes = np.arange(8, 16385, 8)
    times = 3.5 + 0.021 * sizes
    held = fit_held_out(sizes, times, (512, 16384), (512, 16384))
    assert held.fit.intercept_ms == pytest.approx(3.5, abs=1e-9)
    assert held.fit.slope_ms == pytest.approx(0.021, rel=1e-12)
    assert held.error.max == pytest.approx(0.0, abs=1e-12)


def test_the_fit_recovers_known_coefficients_through_noise():
    rng = np.random.default_rng(7)
    sizes = np.arange(512, 32769, 32)
    times = (6.0 + 0.0667 * sizes) * (1 + rng.normal(0, 0.01, len(sizes)))
    held = fit_held_out(sizes, times, (512, 32768), (512, 16384))
    assert held.fit.slope_ms == pytest.approx(0.0667, rel=0.01)
    assert held.fit.intercept_ms == pytest.approx(6.0, abs=1.5)
    # The held-out error is the noise, not a misfit.
    assert held.error.mean < 0.015 and held.error.max < 0.05


def test_fit_and_held_out_sizes_alternate_and_only_the_range_is_used():
    sizes = np.array([1, 2, 4, 8, 16, 32, 64, 128])
    fit_index, held_index = alternate_split(sizes)
    assert sizes[fit_index].tolist() == [1, 4, 16, 64] and sizes[held_index].tolist() == [2, 8, 32, 128]
    held = fit_held_out(sizes, 1.0 + sizes * 0.5, (4, 128), (1, 1000))
    assert held.fit_sizes.tolist() == [4, 16, 64] and held.held_out_sizes.tolist() == [8, 32, 128]
    assert set(held.fit_sizes).isdisjoint(held.held_out_sizes)


def test_relative_error_by_hand():
    fit = LinearFit(0.0, 1.0)
    error = relative_error(fit, np.array([10, 20, 40]), np.array([11.0, 20.0, 50.0]), 10, 20)
    assert error is not None
    assert error.count == 2 and error.max == pytest.approx(1 / 11) and error.worst == 10
    assert error.mean == pytest.approx((1 / 11) / 2)
    assert relative_error(fit, np.array([10]), np.array([1.0]), 100, 200) is None


def test_least_squares_is_on_relative_error():
    # Minimising sum(((a + b x - t) / t)^2) is a polynomial fit weighted 1 / t:
    # a 100-token batch counts as much as a 20k one.
    x = np.array([100.0, 200.0, 10000.0, 20000.0])
    t = (2.0 + 0.01 * x) * np.array([1.1, 0.9, 1.1, 0.9])
    fit = fit_linear(x, t)
    slope, intercept = np.polyfit(x, t, 1, w=1 / t)
    assert (fit.intercept_ms, fit.slope_ms) == pytest.approx((intercept, slope))
    unweighted_slope, unweighted_intercept = np.polyfit(x, t, 1)
    assert fit.intercept_ms != pytest.approx(unweighted_intercept, rel=0.05)


@pytest.mark.parametrize("sizes, times, message", [
    ([1, 2, 3], [1.0, 2.0, 3.0], "at least 4"),
    ([1, 3, 2, 4, 5], [1.0, 2.0, 3.0, 4.0, 5.0], "ascending"),
])
def test_bad_input_is_refused(sizes, times, message):
    with pytest.raises(InvalidArgument, match=message):
        fit_held_out(np.array(sizes), np.array(times), (1, 100), (1, 100))


def test_a_linear_fit_needs_positive_times():
    with pytest.raises(InvalidArgument, match="> 0"):
        fit_linear(np.array([1.0, 2.0]), np.array([1.0, 0.0]))


def test_attention_pair_term_by_hand():
    # Llama-3-8B: 32 layers x 32 query heads x head_dim 128 x 4 FLOP = 524,288 FLOP a pair;
    # at 602 TFLOP/s that is 8.709e-10 s = 8.709e-7 ms.
    assert attention_pair_ms(32, 32, 128, 602.0) == pytest.approx(524288 / 602e12 * 1e3)
    assert attention_pair_ms(32, 32, 128, 602.0) == pytest.approx(8.709e-7, rel=1e-3)
    # Four GPUs share the heads: a quarter of the time.
    assert attention_pair_ms(80, 64, 128, 602.0, gpus=4) == pytest.approx(4 * 64 * 128 * 80 / (4 * 602e12) * 1e3)
    with pytest.raises(InvalidArgument):
        attention_pair_ms(32, 32, 128, 0.0)


def test_prefill_fit_recovers_a_planted_profile_and_its_held_out_error_is_zero():
    from speckv.loadgen.profiles.fit import PrefillFit, prefill_held_out

    planted = PrefillFit(overhead_ms=30.0, ms_per_token=0.4, ms_per_token_pair=2e-5)
    sizes = np.array([256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192])
    fit, error = prefill_held_out(sizes, planted.predict(sizes))
    assert fit.overhead_ms == pytest.approx(30.0, rel=1e-6) and fit.ms_per_token == pytest.approx(0.4, rel=1e-6)
    assert fit.ms_per_token_pair == pytest.approx(2e-5, rel=1e-6)
    assert error.count == 4 and error.max < 1e-9


def test_prefill_fit_error_is_measured_on_the_sizes_it_did_not_see():
    from speckv.loadgen.profiles.fit import PrefillFit, prefill_held_out

    sizes = np.array([100, 200, 300, 400, 500, 600])
    times = PrefillFit(10.0, 1.0, 0.0).predict(sizes)
    times[3] *= 1.5  # size 400 is held out: the fit does not see it, its error does
    fit, error = prefill_held_out(sizes, times)
    assert fit.ms_per_token == pytest.approx(1.0, rel=1e-6)
    assert error.worst == 400 and error.max == pytest.approx(1 / 3, rel=1e-6)


def test_prefill_fit_refuses_too_few_sizes():
    from speckv.loadgen.profiles.fit import prefill_held_out

    with pytest.raises(InvalidArgument):
        prefill_held_out(np.array([1, 2, 3, 4, 5]), np.ones(5))
