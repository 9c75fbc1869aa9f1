"""The demo's table and report: which figures tie with the baseline, what
the verdict says, and that the page holds its table, legend and charts."""
from __future__ import annotations

from dataclasses import replace

import pytest

from speckv.loadgen.experiments.demo_report import (
    LIVE_CHECK,
    LIVE_RUN,
    SIMULATED_RUN,
    TIE_MARK,
    VerdictView,
    demo_cells,
    demo_markdown,
    demo_table,
    write_demo_report,
)
from speckv.loadgen.experiments.e2e_config import SliceSpec
from speckv.loadgen.experiments.metrics import RequestRecord, summarize
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger
from speckv.loadgen.experiments.report import (
    forecast_rates,
    is_tie,
    timeline_families,
    timeline_figure,
    versus,
    write_report,
)
from speckv.loadgen.experiments.results import Comparison, FloorSummary, LiveSetup, PolicySummary


def _summary(ttft_ms: float, ci: dict[str, tuple[float, float]] | None) -> PolicySummary:
    records = [RequestRecord(f"r{i}", 10.5, "f", 1000, 10, "node-0", ttft_ms=ttft_ms + i) for i in range(5)]
    s = summarize(records, frozenset({10}), 2000.0, ReplicaLedger().totals(), 64, {})
    return replace(s, ci95=ci)


def _ci(low: float, high: float) -> dict[str, tuple[float, float]]:
    return {"ttft_p50_ms": (low, high), "ttft_p99_ms": (low, high), "burst_ttft_p99_ms": (low, high),
            "slo_attainment": (1.0, 1.0)}


BASE = _summary(1000.0, _ci(900.0, 1100.0))
OVERLAPPING = _summary(950.0, _ci(850.0, 1050.0))
FASTER = _summary(500.0, _ci(450.0, 550.0))
SLOWER = _summary(2000.0, _ci(1800.0, 2200.0))


def test_without_a_paired_interval_a_tie_is_an_overlap_of_the_two_intervals():
    assert is_tie(OVERLAPPING, BASE, "ttft_p99_ms") is True
    assert is_tie(FASTER, BASE, "ttft_p99_ms") is False
    assert is_tie(_summary(500.0, None), BASE, "ttft_p99_ms") is None


def test_a_paired_interval_of_the_difference_decides_the_tie_when_there_is_one():
    paired_apart = replace(OVERLAPPING, ci95_vs_none={"ttft_p99_ms": (-80.0, -20.0)})
    assert is_tie(paired_apart, BASE, "ttft_p99_ms") is False  # overlapping intervals, yet a difference
    assert versus(paired_apart, BASE, "ttft_p99_ms").endswith(", better")
    paired_holding_zero = replace(FASTER, ci95_vs_none={"ttft_p99_ms": (-600.0, 10.0)})
    assert is_tie(paired_holding_zero, BASE, "ttft_p99_ms") is True
    # a figure without a paired interval falls back to the overlap of the two
    assert is_tie(paired_apart, BASE, "ttft_p50_ms") is True


def test_the_verdict_names_the_change_and_whether_it_is_a_tie():
    assert versus(FASTER, BASE) == "-50%, better"
    assert versus(SLOWER, BASE) == "+100%, worse"
    assert versus(OVERLAPPING, BASE).endswith(", tie")
    assert versus(_summary(500.0, None), BASE) == "-50%"  # no intervals: the bare change
    assert versus(FASTER, BASE, verdict=False) == "-50%"


def test_cells_mark_ties_and_show_intervals_only_when_asked():
    policies = {"none": BASE, "reactive-heat": OVERLAPPING, "predictive": FASTER}
    plain = demo_cells(policies, with_intervals=False)
    assert [c.tie for c in plain["reactive-heat"][:3]] == [True, True, True]
    assert not any(c.tie for c in plain["predictive"][:3]) and not any(c.tie for c in plain["none"])
    assert plain["predictive"][3].tie  # SLO attainment 1.00 in both: a tie
    assert plain["none"][-1].text == "baseline" and plain["predictive"][-1].text == "-50%, better"
    assert "[" not in plain["predictive"][0].text
    live = demo_cells(policies, with_intervals=True)
    assert live["predictive"][1].text == "504 [450-550]"
    assert live["predictive"][-1].text == "-50%"  # a live difference is shown, never called better
    assert live["reactive-heat"][-1].text.endswith(", tie")
    assert plain["reactive-heat"][0].marked().startswith(TIE_MARK)


def test_without_the_baseline_nothing_is_a_tie():
    cells = demo_cells({"predictive": FASTER, "oracle": OVERLAPPING}, with_intervals=True)
    assert not any(c.tie for row in cells.values() for c in row) and cells["oracle"][-1].text == "-"


def test_the_table_says_which_rows_are_simulated_and_which_live():
    simulated = {"none": BASE, "predictive": FASTER}
    live = {"none": BASE, "predictive": OVERLAPPING}
    floor = FloorSummary(80.0, 100.0, 120.0, 130.0)
    table = demo_markdown(simulated, live, floor)
    assert f"| predictive | {SIMULATED_RUN} |" in table and f"| predictive | {LIVE_RUN} | {TIE_MARK}" in table
    assert "| floor |" in table
    assert demo_table("t", simulated, live, floor).row_count == 5


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    simulated = {"none": BASE, "reactive-heat": FASTER, "predictive": OVERLAPPING}
    live = {"none": BASE, "predictive": OVERLAPPING}
    comparison = Comparison(trace="synthetic:x", slice=SliceSpec(10.0, 30.0, 2.0), ttft_target_ms=2000.0,
                            byte_scale_factor=1, nodes=4, engine_profile="p", link_gbps=25.0,
                            real_bytes_per_block=64, burst_seconds_in_trace=1, policies=simulated,
                            floor=FloorSummary(80.0, 100.0, 120.0, 130.0), notes=["a note"])
    timeline = {"forecasts": [(11.0, "f", 3.0), (12.0, "f", 5.0)], "forecast_horizon_s": 10.0,
                "commits": [(12.5, 2**30, "f")]}
    index = write_demo_report(tmp_path_factory.mktemp("report"), "what ran", VERDICT, comparison,
                              replace(comparison, policies=live),
                              {SIMULATED_RUN: {p: [100.0, 200.0] for p in simulated},
                               LIVE_RUN: {p: [150.0, 250.0] for p in live}},
                              {SIMULATED_RUN: {p: timeline for p in simulated}, LIVE_RUN: {p: timeline for p in live}},
                              {"workload": {"name": "synthetic:x"}})
    return index


# The verdict window's view as demo.py builds it from demo_verdict.verdict_table.
VERDICT = VerdictView(
    heading="Verdict (simulated): synthetic:x, trace seconds [10, 190), 4 nodes, seeds 7, 11",
    titles=["policy", "seed 7 burst p99 ms", "seed 11 burst p99 ms", "verdict"],
    rows=[["none", "2000", "2100", "baseline"], ["predictive", "1000", "1100", "better"]],
    legend="how it was made",
    timelines={"predictive": {"forecasts": [(11.0, "f", 3.0), (40.0, "f", 5.0)], "forecast_horizon_s": 10.0,
                              "commits": [(12.5, 2**30, "f")]},
               "none": {"forecasts": [], "commits": []}},
    arrivals=[(10.5, "f"), (11.5, "f"), (41.0, "f"), (100.0, "g")], label="seed 7", run_labels=["seed 7", "seed 11"],
    per_run={"none": [2000.0, 2100.0], "predictive": [1000.0, 1100.0]})


def test_the_report_holds_the_verdict_the_live_check_legends_charts_and_json(page):
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 5
    assert "Verdict (simulated)" in text and f"{TIE_MARK} " in text and "95 % bootstrap interval" in text
    assert f"<h2>{LIVE_CHECK}" in text and "seed 11 burst p99 ms" in text and "how it was made" in text
    # The verdict comes before the live check, and the live check's rows say which are simulated and which live.
    assert text.index("Verdict (simulated)") < text.index(f"<h2>{LIVE_CHECK}") < text.index(LIVE_RUN)
    table = (page.parent / "table.md").read_text()
    assert table.index("| predictive | 1000 | 1100 | better |") < table.index(f"| predictive | {LIVE_RUN} |")
    assert '"live"' in (page.parent / "result.json").read_text()


def test_time_lines_skip_families_where_nothing_happens_over_time():
    arrivals = [(1.0, "lone"), (2.0, "pair"), (3.0, "pair"), (4.0, "replicated"), (5.0, "forecast")]
    timelines = {"predictive": {"forecasts": [(1.0, "lone", 0.2), (2.0, "forecast", 3.0)],
                                "commits": [(4.5, 64, "replicated")]}}
    assert timeline_families(timelines, arrivals) == ["pair", "replicated", "forecast"]
    assert timeline_families({}, [(1.0, "a"), (2.0, "b")]) == []


def test_the_plain_report_calls_a_simulated_burst_p99_but_only_shows_a_live_one(tmp_path):
    paired = replace(FASTER, ci95_vs_none={"burst_ttft_p99_ms": (-560.0, -440.0)})
    policies = {"none": BASE, "predictive": paired, "oracle": OVERLAPPING}
    simulated = Comparison(trace="synthetic:x", slice=SliceSpec(10.0, 30.0, 2.0), ttft_target_ms=2000.0,
                           byte_scale_factor=1, nodes=4, engine_profile="p", link_gbps=25.0,
                           real_bytes_per_block=64, burst_seconds_in_trace=1, policies=policies, floor=None, notes=[])
    timelines = {p: {"forecasts": [], "commits": []} for p in policies}
    ttfts = {p: [100.0, 200.0] for p in policies}
    text = write_report(tmp_path / "sim", simulated, ttfts, timelines, [(10.5, "f")]).read_text()
    assert "Burst p99 against none" in text and "-50%, better" in text and ", tie)" in text
    assert "-500 ms, 95 % [-560, -440]" in text  # the paired interval of the difference, where there is one
    live = replace(simulated, live=LiveSetup("emulated", 64, "conversation", "m"),
                   policies={**policies, "predictive": FASTER})  # a live run is never paired
    text = write_report(tmp_path / "live", live, ttfts, timelines, [(10.5, "f")]).read_text()
    assert "(-50%)" in text and "better" not in text.split("<h2>JSON")[0]


def test_forecasts_are_drawn_per_second_of_their_named_horizon_beside_arrivals_per_second():
    """A 10 s forecast of 4 requests is 0.4 requests/s: the unit of the arrival bars."""
    line = {"forecasts": [(1.0, "f", 4.0), (2.0, "g", 9.0), (3.0, "f", 2.0)], "forecast_horizon_s": 10.0,
            "commits": []}
    assert forecast_rates(line, "f") == [(1.0, 0.4), (3.0, 0.2)]
    assert forecast_rates(line, "h") == []
    figure = timeline_figure({"predictive": line}, [(1.2, "f"), (1.5, "f"), (2.5, "f")])
    ax = figure.axes[0]
    assert ax.get_ylabel() == "requests / s"
    (drawn,) = [ln for ln in ax.get_lines() if "forecast" in str(ln.get_label())]
    assert list(drawn.get_ydata()) == [0.4, 0.2] and "next 10 s" in str(drawn.get_label())


def test_a_time_line_with_forecasts_but_no_horizon_is_refused():
    with pytest.raises(ValueError, match="forecast_horizon_s"):
        forecast_rates({"forecasts": [(1.0, "f", 4.0)], "commits": []}, "f")
