"""The structural signal (a turn's announced follow-ups) is a feature of the
session-return model, never a rule: trained on conversations whose announced
turns come back within seconds and whose others come back minutes later, the
model serves a far higher P(return within 30 s) to an announced turn end than
to the same turn end unannounced; the training rows carry it; the served core
checks it and keeps it in its warm file."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.traces.records import TraceRequest
from speckv.services.predictor.fitting.returns.dataset import build_rows
from speckv.services.predictor.fitting.returns.training import train_before
from speckv.services.predictor.fitting.returns.turns import build_turns
from speckv.services.predictor.serving.returns.serving import (
    MAX_FOLLOW_UPS,
    ReturnsCore,
    ReturnsSettings,
    TurnEndRecord,
)
from speckv.services.predictor.serving.returns.store import (
    PastTurn,
    SavedReturnModel,
    read_past_turns,
    write_past_turns,
)
from tests.support.returns_model import CONFIG

DURATION_S = 4 * 3600.0


def announced_conversations(n: int = 500, seed: int = 11) -> list[TraceRequest]:
    """Each turn announces a follow-up with chance 1/2; an announced turn's
    next arrives 5-15 s after its end (service ~ CONFIG.service), any other
    turn's 300-900 s after, or never (the conversation ends, chance 1/4).
    Prompt and output sizes are drawn the same either way."""
    rng = np.random.default_rng(seed)
    out: list[TraceRequest] = []
    for k in range(n):
        t = float(rng.uniform(0.0, DURATION_S))
        prompt = int(rng.integers(800, 3000))
        while t < DURATION_S:
            output = int(rng.integers(20, 300))
            announced = bool(rng.random() < 0.5)
            out.append(TraceRequest(t, prompt, output, (0, k + 1), 512, f"c{k}", follow_ups=int(announced)))
            end = t + CONFIG.service(prompt, output)
            if announced:
                t = end + float(rng.uniform(5.0, 15.0))
            elif rng.random() < 0.25:
                break
            else:
                t = end + float(rng.uniform(300.0, 900.0))
            prompt += output + int(rng.integers(50, 400))
    out.sort(key=lambda r: (r.arrival_s, r.family))
    return out


@pytest.fixture(scope="module")
def trained():
    result = train_before(announced_conversations(), DURATION_S, CONFIG)
    assert result is not None
    return result


def test_the_training_rows_carry_each_turns_announced_follow_ups():
    requests = announced_conversations(60, seed=4)
    rows = build_rows(build_turns(requests, CONFIG.service), CONFIG.features)
    column = list(CONFIG.features.names()).index(CONFIG.features.signal_name)
    assert set(np.unique(rows.X[:, column]).tolist()) == {0.0, 1.0}


def test_an_announced_turn_end_is_served_a_far_likelier_return_than_the_same_turn_unannounced(trained):
    now = DURATION_S + 100.0
    core = ReturnsCore(ManualClock(now), ReturnsSettings(),
                       SavedReturnModel(trained.model, trained.spec, "signal-test", "", "test"))
    core.report([TurnEndRecord("told", now - 9.0, now, 1500, 100, follow_ups=1),
                 TurnEndRecord("silent", now - 9.0, now, 1500, 100, follow_ups=0)])
    answer = core.forecast(30.0)
    p = dict(zip(answer.conversations, answer.probabilities.tolist()))
    assert p["told"] > 0.5 > 0.2 > p["silent"]


def test_follow_ups_beyond_the_cap_refuse_the_batch_whole(trained):
    now = DURATION_S + 100.0
    core = ReturnsCore(ManualClock(now), ReturnsSettings(),
                       SavedReturnModel(trained.model, trained.spec, "signal-test", "", "test"))
    with pytest.raises(InvalidArgument, match=r"turn_ends\[1\]\.follow_ups"):
        core.report([TurnEndRecord("a", now - 9.0, now, 1500, 100),
                     TurnEndRecord("b", now - 9.0, now, 1500, 100, follow_ups=MAX_FOLLOW_UPS + 1)])
    assert core.forecast(30.0).conversations == []  # the good one was not applied either


def test_the_warm_file_keeps_follow_ups_and_older_files_still_read(tmp_path):
    turns = [PastTurn("a", 1.0, 3.0, 100, 10, follow_ups=4), PastTurn("b", 2.0, None, 100, 10)]
    path = write_past_turns(tmp_path / "warm.jsonl", turns)
    assert read_past_turns(path) == turns
    assert "follow_ups" not in path.read_text().splitlines()[1]  # written only where it is said
    old = tmp_path / "old.jsonl"
    old.write_text('{"conversation": "a", "arrival_s": 1.0, "end_s": 3.0, "prompt_tokens": 1, "output_tokens": 2}\n')
    assert read_past_turns(old) == [PastTurn("a", 1.0, 3.0, 1, 2)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversation": "a", "arrival_s": 1.0, "end_s": 3.0, "prompt_tokens": 1, "output_tokens": 2, '
                   '"follow_ups": -1}\n')
    with pytest.raises(InvalidArgument, match="follow_ups"):
        read_past_turns(bad)
