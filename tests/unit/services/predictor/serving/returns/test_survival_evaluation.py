"""Survival arithmetic and scores on hand-computed cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from speckv.services.predictor.judging.returns import evaluation
from speckv.services.predictor.serving.returns import survival

H = (10.0, 20.0)
F = np.array([[0.2, 0.5]])
TAIL = survival.Tail((10.0, 20.0), (0.8, 0.5))  # of those idle at 20 s, 80 % still idle at 30 s, 50 % at 40 s


def test_monotone_is_a_running_max_clipped_to_unit():
    out = survival.monotone(np.array([[0.3, 0.2, 0.5], [-0.1, 1.2, 0.9]]))
    assert out.tolist() == [[0.3, 0.3, 0.5], [0.0, 1.0, 1.0]]


def test_cdf_is_linear_between_horizons_then_follows_the_tail():
    x = np.array([0.0, 5.0, 15.0, 20.0, 25.0, 30.0, 40.0, 90.0])
    rows = np.repeat(F, len(x), axis=0)
    assert survival.cdf_at(rows, H, x, TAIL) == pytest.approx([0.0, 0.1, 0.35, 0.5, 0.55, 0.6, 0.75, 0.75])
    assert survival.cdf_at(rows, H, x) == pytest.approx([0.0, 0.1, 0.35, 0.5, 0.5, 0.5, 0.5, 0.5])  # no tail: flat


def test_conditional_probability_by_hand():
    # idle 5 s, within 10 s of now: (F(15) - F(5)) / (1 - F(5)) = (0.35 - 0.1) / 0.9
    assert survival.within(F, H, 5.0, 10.0)[0] == pytest.approx(0.25 / 0.9)
    # idle 15 s, within 10 s: S(15) = 0.65, S(25) = 0.45 with the tail, 0.5 without
    assert survival.within(F, H, 15.0, 10.0, TAIL)[0] == pytest.approx(0.2 / 0.65)
    assert survival.within(F, H, 15.0, 10.0)[0] == pytest.approx(0.15 / 0.65)
    # idle 0: the plain horizon probabilities
    assert survival.within(F, H, 0.0, 20.0)[0] == pytest.approx(0.5)
    # vectorised over rows and idle times
    both = survival.within(np.repeat(F, 2, axis=0), H, np.array([5.0, 15.0]), 10.0, TAIL)
    assert both == pytest.approx([0.25 / 0.9, 0.2 / 0.65])


def test_expected_time_and_remaining_by_hand():
    assert survival.expected_time(F, H)[0] == pytest.approx(10 * 0.9 + 10 * 0.65)  # trapezoids: 15.5
    # idle 10 s, cap 20 s: integral of S over [10, 30] / S(10) = (6.5 + 10 (0.5 + 0.4) / 2) / 0.8
    assert survival.expected_remaining(F, H, 10.0, tail=TAIL)[0] == pytest.approx(11.0 / 0.8)
    assert survival.expected_remaining(F, H, 10.0)[0] == pytest.approx(11.5 / 0.8)
    never = np.array([[0.0, 0.0]])
    assert survival.expected_time(never, H)[0] == pytest.approx(20.0)  # never returns: the cap
    assert survival.within(never, H, 50.0, 10.0)[0] == 0.0  # no tail: no hazard past the last horizon


def test_certain_return_already_due_is_overdue():
    sure = np.array([[0.5, 1.0]])
    assert survival.within(sure, H, 25.0, 5.0, TAIL)[0] == 1.0
    assert survival.expected_remaining(sure, H, 25.0)[0] == 0.0
    assert survival.cdf_at(sure, H, 40.0)[0] == 1.0


def test_kaplan_meier_tail_by_hand():
    inf = np.inf
    delay = np.array([5.0, 15.0, inf, 25.0, inf, 40.0])
    censor = np.array([100.0, 100.0, 18.0, 100.0, 100.0, 8.0])  # the first and last are not at risk at 10 s
    # at risk: 15 (return), 18 (censored), 25 (return), 100 (censored): KM 3/4 after 15, 3/8 after 25
    tail = survival.kaplan_meier_tail(delay, censor, 10.0, 10.0, min_at_risk=1)
    assert tail.offsets_s == tuple(float(x) for x in range(10, 91, 10))  # the last one at risk is at 100 s
    assert tail.ratio == pytest.approx([0.75] + [0.375] * 8)
    assert survival.kaplan_meier_tail(delay, censor, 10.0, 10.0, min_at_risk=2) == survival.Tail((10.0,), (0.75,))
    assert survival.kaplan_meier_tail(delay[:1], censor[:1], 10.0, 10.0, 1) == survival.Tail()
    with pytest.raises(ValueError):
        survival.Tail((10.0, 5.0), (0.9, 0.8))


def test_auc_rank_formula_with_ties():
    assert evaluation.auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    assert evaluation.auc(np.array([0.5, 0.5]), np.array([0, 1])) == pytest.approx(0.5)
    assert evaluation.auc(np.array([0.2, 0.5, 0.5]), np.array([0, 1, 0])) == pytest.approx(0.75)
    assert math.isnan(evaluation.auc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_brier_by_hand():
    assert evaluation.brier(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.6325 / 4)


def test_ece_equal_mass_bins_keep_ties_together():
    p = np.r_[np.full(10, 0.1), np.full(10, 0.7)]
    y = np.r_[[1, 1] + [0] * 8, [1] * 6 + [0] * 4]
    table = evaluation.calibration_table(p, y)
    assert [(b["bin"], b["rows"]) for b in table] == [(0, 10), (5, 10)]
    assert evaluation.ece(p, y) == pytest.approx(0.5 * 0.1 + 0.5 * 0.1)
    assert evaluation.ece(np.full(8, 0.3), np.array([1, 1, 1, 1, 0, 0, 0, 0])) == pytest.approx(0.2)
    # distinct values: 10 bins of 2 rows, perfectly calibrated pairs
    p2 = np.repeat(np.linspace(0.05, 0.95, 10), 2)
    y2 = np.zeros(20)
    y2[1::2] = (np.linspace(0.05, 0.95, 10) > 0.5)
    table2 = evaluation.calibration_table(p2, y2)
    assert len(table2) == 10 and all(b["rows"] == 2 for b in table2)
    manual = np.mean([abs(y2[2 * k:2 * k + 2].mean() - p2[2 * k]) for k in range(10)])
    assert evaluation.ece(p2, y2) == pytest.approx(manual)


def test_score_has_the_documented_keys():
    s = evaluation.score(np.array([0.2, 0.8]), np.array([0, 1]))
    assert set(s) == {"rows", "base_rate", "mean_p", "auc", "brier", "ece"} and s["auc"] == 1.0
