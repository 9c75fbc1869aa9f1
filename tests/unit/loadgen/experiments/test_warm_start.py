"""The e2e comparison's pre-slice state: the warm start keeps the newest KV
that fits, and the predictor model is trained on trace before the slice only."""
from __future__ import annotations

import pytest

from speckv.loadgen.bench.e2e.model import train_before_slice
from speckv.loadgen.experiments.e2e_config import SliceSpec
from speckv.loadgen.experiments.warm_start import resident_tail
from speckv.services.common.errors import FailedPrecondition
from speckv.services.common.traces import TraceRequest


def _request(t: float, hashes: tuple[int, ...], family: str = "") -> TraceRequest:
    return TraceRequest(t, 512 * len(hashes) + 1, 4, hashes, 512, family or f"0/{hashes[1]}")


def test_resident_tail_keeps_the_newest_requests_whose_blocks_fit():
    requests = [_request(0.0, (0, 1, 2)), _request(1.0, (0, 3, 4)), _request(2.0, (0, 1, 2, 5))]
    assert resident_tail(requests, 6) == 0  # 6 distinct blocks: everything fits
    assert resident_tail(requests, 5) == 2  # the newest holds 4, the next adds 2 more: out
    assert resident_tail(requests, 4) == 2
    assert resident_tail(requests, 3) == 3  # not even the newest fits
    assert resident_tail([], 3) == 0


def test_the_model_is_trained_on_the_window_before_the_slice_only(tmp_path):
    before = [_request(t * 0.5, (0, 100 + t % 7, 200 + t % 7)) for t in range(0, 600)]  # [0, 300) s
    inside = [_request(300.0 + t, (0, 999, 998), "0/999") for t in range(20)]
    slice_ = SliceSpec(300.0, 20.0, 2.0)
    with pytest.raises(FailedPrecondition):
        train_before_slice(before, SliceSpec(60.0, 20.0, 2.0), tmp_path / "refused", quick=True, window_s=600.0)
    directory = tmp_path / "model"
    model = train_before_slice(before + inside, slice_, directory, quick=True, window_s=200.0)
    assert model.trace_span_s == (100.0, 300.0)
    assert model.requests == sum(1 for r in before if 100.0 <= r.arrival_s < 300.0)
    assert model.families == 7  # "0/999" arrives only in the slice: never seen
    assert (directory / "manifest.json").exists()

