"""Negative-binomial quantile table and tail against scipy, and the dispersion fit."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from speckv.services.predictor.serving import negbin, poisson


@pytest.mark.parametrize("phi", [0.05, 0.4, 2.0])
@pytest.mark.parametrize("q", [0.5, 0.9])
def test_quantile_and_tail_match_scipy(phi, q):
    rng = np.random.default_rng(1)
    mu = np.concatenate([[0.0, 1e-4], np.exp(rng.uniform(np.log(1e-3), np.log(200.0), 3000))])
    r = 1.0 / phi
    expected = np.where(mu > 0, stats.nbinom.ppf(q, r, r / (r + mu)), 0.0)
    np.testing.assert_array_equal(negbin.quantile(q, mu, phi), expected)
    threshold = rng.uniform(0.0, 60.0, len(mu))
    np.testing.assert_allclose(negbin.exceed_probability(threshold, mu, phi),
                               np.where(mu > 0, stats.nbinom.sf(np.floor(threshold), r, r / (r + mu)), 0.0),
                               rtol=1e-9, atol=1e-14)


def test_means_past_the_table_are_searched_exactly():
    mu, phi = np.array([5_000.0, 20_000.0]), 0.01
    r = 1.0 / phi
    assert (negbin.quantile(0.9, mu, phi) >= negbin.TABLE_K).all()
    np.testing.assert_array_equal(negbin.quantile(0.9, mu, phi), stats.nbinom.ppf(0.9, r, r / (r + mu)))


def test_zero_dispersion_is_poisson():
    mu = np.array([0.0, 0.3, 4.0, 50.0])
    np.testing.assert_array_equal(negbin.quantile(0.9, mu, 0.0), poisson.quantile(0.9, mu))
    np.testing.assert_array_equal(negbin.exceed_probability(np.full(4, 5.0), mu, 0.0),
                                  poisson.exceed_probability(np.full(4, 5.0), mu))


def test_dispersion_fit_recovers_a_planted_value_and_clips_underdispersion():
    rng = np.random.default_rng(2)
    mu = rng.uniform(0.5, 20.0, 200_000)
    r = 1.0 / 0.5
    y = rng.negative_binomial(r, r / (r + mu))
    assert negbin.fit_dispersion(mu, y) == pytest.approx(0.5, rel=0.05)
    assert negbin.fit_dispersion(mu, np.round(mu)) == 0.0  # less spread than Poisson: Poisson
