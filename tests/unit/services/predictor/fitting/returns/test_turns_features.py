"""Turn records, and the feature builder's causality and bookkeeping."""
from __future__ import annotations

import math

import numpy as np
import pytest

from speckv.services.common.traces.records import TraceRequest
from speckv.services.predictor.fitting.returns.dataset import build_rows
from speckv.services.predictor.fitting.returns.turns import LinearServiceModel, build_turns
from speckv.services.predictor.serving.returns.features import ReturnFeatures, ReturnFeatureSpec
from tests.support.returns_conversations import conversations

SPEC = ReturnFeatureSpec(horizons_s=(30.0, 60.0, 120.0, 300.0, 600.0))


def _req(t: float, family: str, prompt: int = 1000, output: int = 100) -> TraceRequest:
    return TraceRequest(t, prompt, output, (0, 1), 512, family)


def test_turns_link_a_conversations_requests_in_arrival_order():
    reqs = [_req(0.0, "a", 1000, 100), _req(5.0, "b"), _req(50.0, "a", 1500, 50), _req(400.0, "a", 2000, 10)]
    turns = build_turns(reqs, service_s=lambda p, o: 0.001 * p + 0.1 * o)
    a = sorted((t for t in turns if t.conversation == "a"), key=lambda t: t.turn_index)
    assert [t.turn_index for t in a] == [0, 1, 2]
    assert [t.next_arrival_s for t in a] == [50.0, 400.0, None]
    assert a[0].end_s == pytest.approx(0.0 + 1.0 + 10.0) and a[0].return_delay_s == pytest.approx(39.0)
    assert math.isinf(a[2].return_delay_s)
    assert [t.end_s for t in turns] == sorted(t.end_s for t in turns)


def test_default_service_model_and_overlap():
    model = LinearServiceModel()
    assert model(12_000, 343) == pytest.approx(12_000 * 25e-6 + 343 * 0.02)
    turns = build_turns([_req(0.0, "a", 0, 500), _req(6.0, "a")])  # 10 s of decode, next turn at 6 s
    first = next(t for t in turns if t.turn_index == 0)
    assert first.overlapped and first.return_delay_s < 0
    rows = build_rows(turns, SPEC)
    assert len(rows) == 1 and rows.turn_index.tolist() == [1]  # an overlapped turn gets no row
    with pytest.raises(ValueError):
        LinearServiceModel(decode_s_per_token=-1.0)


def test_a_turn_ends_row_uses_nothing_after_its_end():
    """Build rows, then replace every arrival after one turn's end with
    different random data: that turn's row must not change."""
    reqs = conversations(200, 1800.0, seed=4)
    turns = build_turns(reqs)
    rows = build_rows(turns, SPEC)
    rng = np.random.default_rng(9)
    for j in rng.choice(len(rows), size=8, replace=False):
        end = rows.end_s[j]
        kept = [r for r in reqs if r.arrival_s <= end]
        # new future: other conversations, other times and sizes, some continuing old ones
        families = [r.family for r in kept] + [f"new{i}" for i in range(50)]
        future = [TraceRequest(float(end + rng.uniform(1e-3, 900.0)), int(rng.integers(1, 50_000)),
                               int(rng.integers(1, 900)), (0, 1), 512, str(rng.choice(families)))
                  for _ in range(300)]
        other = build_rows(build_turns(kept + future), SPEC)
        match = np.flatnonzero((other.conversation == rows.conversation[j]) & (other.arrival_s == rows.arrival_s[j]))
        assert len(match) == 1
        np.testing.assert_array_equal(other.X[match[0]], rows.X[j])


def test_online_builder_matches_the_offline_rows_fed_the_same_events():
    turns = build_turns(conversations(80, 1200.0, seed=1))
    rows = build_rows(turns, SPEC)
    builder = ReturnFeatures(SPEC)
    events = sorted([(t.arrival_s, 0, t.conversation, t.turn_index, t) for t in turns]
                    + [(t.end_s, 1, t.conversation, t.turn_index, t) for t in turns], key=lambda e: e[:4])
    live = {}
    for time_s, kind, conversation, _, turn in events:
        if kind == 0:
            builder.arrival(conversation, time_s, turn.prompt_tokens)
        else:
            live[(conversation, turn.arrival_s)] = builder.turn_end(conversation, time_s, turn.arrival_s,
                                                                    turn.prompt_tokens, turn.output_tokens)
    for k in range(len(rows)):
        np.testing.assert_array_equal(live[(rows.conversation[k], rows.arrival_s[k])], rows.X[k])


def test_conversation_cluster_and_resolved_share_features_by_hand():
    spec = ReturnFeatureSpec(horizons_s=(30.0, 100.0), rate_windows_s=(100.0,), active_window_s=300.0,
                             share_window_s=1000.0)
    f = ReturnFeatures(spec)
    names = spec.names()
    col = {n: i for i, n in enumerate(names)}
    f.arrival("a", 0.0, 1000)
    f.turn_end("a", 10.0, 0.0, 1000, 100)  # resolves at 40 (30 s) and 110 (100 s)
    f.arrival("b", 20.0, 500)
    f.turn_end("b", 25.0, 20.0, 500, 10)  # resolves at 55 and 125: b never returns
    f.arrival("a", 50.0, 1800)  # a returned 40 s after its end: not within 30, within 100
    row = f.turn_end("a", 120.0, 50.0, 1800, 7, signal=1.0)
    assert row[col["turn_index"]] == 1 and row[col["prompt_growth"]] == 800 and row[col["gap_prev_s"]] == 50.0
    assert row[col["mean_gap_s"]] == 50.0 and row[col["age_s"]] == 120.0 and row[col["duration_s"]] == 70.0
    assert row[col["cluster_rate_100s"]] == pytest.approx(1 / 100)  # only the arrival at 50 is in (20, 120]
    assert row[col["active_conversations_300s"]] == 2
    assert row[col["return_share_30s"]] == 0.0  # both 30 s windows closed (40, 55), neither returned in time
    assert row[col["return_share_100s"]] == 1.0  # only a's 100 s window closed (110): returned
    assert row[col["signal"]] == 1.0
    first = ReturnFeatures(spec).turn_end("z", 5.0, 1.0, 10, 1)
    assert first[col["turn_index"]] == 0 and np.isnan(first[[col["gap_prev_s"], col["return_share_30s"]]]).all()
    assert first[col["signal"]] == 0.0  # the structural signal defaults to 0


def test_builder_caps_conversations_lru():
    f = ReturnFeatures(ReturnFeatureSpec(max_conversations=2))
    for k, c in enumerate(["a", "b", "a", "c"]):
        f.arrival(c, float(k))
    assert len(f) == 2 and f.returned_since("b", -1.0) is None and f.returned_since("a", 0.0) == 2.0


def test_time_never_goes_backwards_but_a_turn_finds_its_given_arrival():
    f = ReturnFeatures(ReturnFeatureSpec(horizons_s=(30.0,), rate_windows_s=(60.0,)))
    f.arrival("a", 100.0)
    f.arrival("b", 90.0)  # late report: counted at 100 in the windows, kept at 90 in b's history
    assert f.now == 100.0
    row = f.turn_end("b", 95.0, 90.0, 10, 10)
    names = f.names()
    assert row[names.index("turn_index")] == 0 and row[names.index("duration_s")] == 10.0  # 100 - 90
    assert f.returned_since("b", 90.0) is None
