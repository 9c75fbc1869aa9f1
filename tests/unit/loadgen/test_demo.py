"""`speckv demo`'s choices before anything runs: which workload (the trace
when it is there, the synthetic default otherwise, with one line saying how
to get the trace) and which slice of it."""
from __future__ import annotations

import json

import pytest

from speckv.loadgen import demo
from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.traces import TraceRequest


@pytest.fixture(scope="module")
def config():
    return load_e2e_config()


@pytest.mark.parametrize("layout", ["missing", "empty", "other files"])
def test_without_the_trace_it_runs_on_the_synthetic_default_and_says_how_to_get_the_trace(tmp_path, config, layout):
    directory = tmp_path / "traces"
    if layout != "missing":
        directory.mkdir()
    if layout == "other files":
        (directory / "AzureLLMInferenceTrace_code.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    workload = demo.choose_workload(str(directory), demo.DEFAULT_TRACE, demo.DEFAULT_SCENARIO, {}, config)
    assert workload.synthetic and workload.name == f"synthetic:{demo.DEFAULT_SCENARIO}"
    assert len(workload.requests) > 1000
    assert workload.hint is not None and "\n" not in workload.hint
    assert str(directory / demo.DEFAULT_TRACE) in workload.hint
    assert "kvcache-ai/Mooncake" in workload.hint and "--traces" in workload.hint


def test_the_environment_names_the_directory_when_the_flag_does_not(tmp_path, config):
    workload = demo.choose_workload(None, demo.DEFAULT_TRACE, demo.DEFAULT_SCENARIO,
                                    {"SPECKV_TRACES": str(tmp_path / "nowhere")}, config)
    assert workload.synthetic and str(tmp_path / "nowhere") in (workload.hint or "")


def test_with_the_trace_it_runs_on_the_trace(tmp_path, config):
    rows = [{"timestamp": 1000 * i, "input_length": 1024, "output_length": 10, "hash_ids": [0, i, i + 100]}
            for i in range(5)]
    (tmp_path / demo.DEFAULT_TRACE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    workload = demo.choose_workload(str(tmp_path), demo.DEFAULT_TRACE, demo.DEFAULT_SCENARIO, {}, config)
    assert not workload.synthetic and workload.hint is None
    assert workload.name == demo.DEFAULT_TRACE and len(workload.requests) == 5
    assert workload.requests[1].family == "0/1"  # keyed as the configuration says: the conversation


def test_the_synthetic_default_slice_lies_after_the_warm_up_around_a_burst(tmp_path, config):
    workload = demo.choose_workload(str(tmp_path / "missing"), demo.DEFAULT_TRACE, demo.DEFAULT_SCENARIO, {},
                                    config)
    slice_ = demo.demo_slice(workload.requests, config.warmup_s, demo.DEMO_SLICE_S, 2.0)
    first = workload.requests[0].arrival_s
    assert first + config.warmup_s <= slice_.start_s < first + 2 * config.warmup_s
    assert slice_.duration_s == demo.DEMO_SLICE_S and slice_.speed == 2.0
    inside = [r for r in workload.requests if slice_.start_s <= r.arrival_s < slice_.start_s + slice_.duration_s]
    assert len(inside) > 50


def _at(*seconds: float) -> list[TraceRequest]:
    return [TraceRequest(s, 512, 10, (1,), 512, "f") for s in sorted(seconds)]


def test_the_slice_starts_lead_seconds_before_the_largest_burst_after_the_warm_up():
    # 400 trace seconds, nearly all empty, so every busy second is a burst
    # second: 20 arrivals at 150 s (inside the warm-up: not eligible), 10 at
    # 250 s, 30 at 300-301 s (one burst), one at 399 s.
    requests = _at(0.1, *[150.1] * 20, *[250.1] * 10, *[300.1] * 15, *[301.1] * 15, 399.1)
    slice_ = demo.demo_slice(requests, warmup_s=200.0, duration_s=30.0, speed=2.0)
    assert slice_.start_s == 300.0 - demo.LEAD_S


def test_without_a_burst_after_the_warm_up_the_slice_starts_when_the_history_allows():
    # Busy seconds at 0, 20, 42 and 99: none begins in [warm-up + lead, 2 x warm-up) = [45, 80).
    requests = _at(0.1, *[20.1] * 10, 42.5, 99.5)
    assert demo.demo_slice(requests, warmup_s=40.0, duration_s=10.0, speed=2.0).start_s == 40.0


def test_an_explicit_start_wins_and_a_slice_past_the_end_is_refused():
    requests = _at(*[s + 0.5 for s in range(100)])
    assert demo.demo_slice(requests, 40.0, 10.0, 2.0, start_s=60.0).start_s == 60.0
    with pytest.raises(InvalidArgument, match="ends at"):
        demo.demo_slice(requests, 40.0, 10.0, 2.0, start_s=95.0)


def test_burst_seconds_close_together_are_one_burst():
    assert demo.burst_runs(frozenset({3, 4, 6, 10, 11})) == [(3, 6), (10, 11)]
    assert demo.burst_runs(frozenset()) == []


def test_the_live_oracle_is_refused_on_a_synthetic_workload(tmp_path):
    with pytest.raises(InvalidArgument, match="oracle"):
        demo.main(["--traces", str(tmp_path / "missing"), "--live", "none,oracle"], {})


def test_flags_name_each_policy_once():
    with pytest.raises(InvalidArgument):
        demo.parse_args(["--live", "none,none"])
    args = demo.parse_args([])
    assert args.live_list == ["none", "predictive"] and "oracle" in args.policy_list
