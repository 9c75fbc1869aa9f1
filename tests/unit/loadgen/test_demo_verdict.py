"""The demo's verdict (loadgen/demo_verdict.py): a window holding several
bursts, every evaluation seed simulated (in worker processes but the first,
with the same figures as in this process), and each policy judged against
`none` by the interval between seeds, or, on one trace, paired over requests."""
from __future__ import annotations

import dataclasses

import pytest

from speckv.loadgen import demo, demo_verdict
from speckv.loadgen.experiments.e2e_config import SliceSpec, load_e2e_config
from speckv.loadgen.experiments.metrics import burst_seconds
from speckv.loadgen.experiments.results import PolicySummary
from speckv.loadgen.workload.scenarios import get_scenario, seed_sets
from speckv.services.common.traces import TraceRequest


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **_kwargs) -> None:
        self.lines.append(str(text))


@pytest.fixture(scope="module")
def config():
    return load_e2e_config()


def _summary(burst_p99_ms: float | None, paired: tuple[float, float] | None = None) -> PolicySummary:
    figures = {f.name: None for f in dataclasses.fields(PolicySummary)}
    return PolicySummary(**{**figures, "burst_ttft_p99_ms": burst_p99_ms, "bytes_replicated": 2**30,
                            "ci95_vs_none": {"burst_ttft_p99_ms": paired} if paired else None})


def _run(seed: int | None, **summaries: PolicySummary) -> demo_verdict.SeedRun:
    return demo_verdict.SeedRun(seed, 3, 100, {k.replace("_", "-"): v for k, v in summaries.items()}, {}, [])


def test_the_evaluation_seeds_are_the_committed_set():
    assert demo_verdict.evaluation_seeds() == seed_sets()["evaluation"]
    assert demo_verdict.evaluation_seeds()[0] == demo.SCENARIO_SEED  # the live check's workload is the first


def test_on_the_synthetic_default_the_window_holds_the_live_slice_and_several_bursts_on_every_seed(tmp_path,
                                                                                                   config):
    workload = demo.choose_workload(str(tmp_path / "missing"), demo.DEFAULT_TRACE, demo.DEFAULT_SCENARIO, {},
                                    config)
    live = demo.demo_slice(workload.requests, config.warmup_s, demo.DEMO_SLICE_S, 2.0)
    window = demo_verdict.verdict_window(workload.requests, live)
    assert window.start_s == live.start_s and window.duration_s == demo_verdict.VERDICT_S > live.duration_s
    assert window.speed == 1.0
    for seed in demo_verdict.evaluation_seeds():
        requests = get_scenario(demo.DEFAULT_SCENARIO, seed, config.block_tokens).requests()
        assert demo_verdict.bursts_in(burst_seconds(r.arrival_s for r in requests), window) >= 2, seed


def test_the_window_is_never_shorter_than_the_slice_nor_runs_past_the_workload():
    requests = [TraceRequest(float(s), 512, 10, (1,), 512, "f") for s in range(300)]
    assert demo_verdict.verdict_window(requests, SliceSpec(250.0, 30.0, 2.0)).duration_s == 49.0
    assert demo_verdict.verdict_window(requests, SliceSpec(280.0, 30.0, 2.0)).duration_s == 30.0
    assert demo_verdict.verdict_window(requests, SliceSpec(10.0, 30.0, 2.0), 100.0).duration_s == 100.0


def test_bursts_count_runs_of_burst_seconds_that_begin_in_the_window():
    window = SliceSpec(10.0, 20.0, 1.0)
    # Runs (3, 4), (9, 12): begins before, (20, 21), (29, 29), (30, 30): after.
    assert demo_verdict.bursts_in(frozenset({3, 4, 9, 10, 11, 12, 20, 21, 29, 30}), window) == 2


def test_between_seeds_a_consistent_difference_is_a_verdict_and_a_mixed_one_a_tie():
    runs = [_run(7, none=_summary(2000), better=_summary(1000), mixed=_summary(1500)),
            _run(11, none=_summary(2100), better=_summary(1100), mixed=_summary(2600)),
            _run(13, none=_summary(1900), better=_summary(950), mixed=_summary(1900))]
    verdicts = {v.policy: v for v in demo_verdict.judge(runs, ["none", "better", "mixed"])}
    assert verdicts["none"].verdict == "baseline" and verdicts["none"].mean_ms == pytest.approx(2000)
    better = verdicts["better"]
    assert better.verdict == "better" and better.burst_p99_ms == [1000, 1100, 950]
    assert better.difference_ms == pytest.approx(1016.6667 - 2000, abs=0.01)
    assert better.low_ms < better.difference_ms < better.high_ms < 0
    assert verdicts["mixed"].verdict == "tie" and verdicts["mixed"].low_ms < 0 < verdicts["mixed"].high_ms


def test_on_one_trace_the_verdict_reads_the_paired_interval_over_requests():
    runs = [_run(None, none=_summary(3000), worse=_summary(3300, (120.0, 480.0)), tied=_summary(2900, (-250.0, 40.0)))]
    verdicts = {v.policy: v for v in demo_verdict.judge(runs, ["none", "worse", "tied"])}
    assert verdicts["worse"].verdict == "worse" and (verdicts["worse"].low_ms, verdicts["worse"].high_ms) == (120, 480)
    assert verdicts["tied"].verdict == "tie"


def test_the_table_names_each_seed_and_the_interval():
    runs = [_run(s, none=_summary(2000 + s), predictive=_summary(1000 + s)) for s in (7, 11, 13)]
    verdict = demo_verdict.DemoVerdict("synthetic:x", SliceSpec(100.0, 180.0, 1.0), 4, [7, 11, 13], runs,
                                       demo_verdict.judge(runs, ["none", "predictive"]), "speckv simulate ...", "p")
    titles, rows = demo_verdict.verdict_table(verdict)
    assert titles[1:4] == ["seed 7 burst p99 ms", "seed 11 burst p99 ms", "seed 13 burst p99 ms"]
    assert rows[1][:5] == ["predictive", "1007", "1011", "1013", "1010"] and rows[1][-2] == "better"
    assert "Welch interval between seeds" in verdict.headline() and "3 / 3 / 3 per seed" in verdict.headline()


def test_every_seed_is_simulated_and_a_worker_gives_the_figures_this_process_does(tmp_path):
    # A short window (one burst of seed 7 or so) and two policies keep it to seconds a seed.
    window = SliceSpec(1163.0, 20.0, 1.0)
    console = _Console()
    pending = demo_verdict.PendingVerdict("synthetic:document-bursts", "document-bursts", True,
                                          ["none", "reactive-heat"], 4, window)
    verdict = pending.finish(console)
    assert [r.seed for r in verdict.runs] == demo_verdict.evaluation_seeds()
    assert len([line for line in console.lines if line.startswith("verdict window, seed")]) == 3
    assert "--seeds evaluation" in verdict.command and "--start-s 1163 --duration-s 20" in verdict.command
    heat = next(v for v in verdict.policies if v.policy == "reactive-heat")
    assert len(heat.burst_p99_ms) == 3 and heat.verdict in ("better", "worse", "tie")
    # Seed 11 ran in a worker process; here it gives the same figures.
    here, _ = demo_verdict._run_seed("document-bursts", True, 11, ["none", "reactive-heat"], 4, window, None)
    there = verdict.runs[1]
    for policy in ("none", "reactive-heat"):
        assert here.summaries[policy].burst_ttft_p99_ms == there.summaries[policy].burst_ttft_p99_ms
        assert here.summaries[policy].ttft_p50_ms == there.summaries[policy].ttft_p50_ms
