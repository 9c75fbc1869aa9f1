"""Azure and BurstGPT loaders, the format dispatch, and Mooncake's conversation family."""
from __future__ import annotations

import collections

import pytest

from speckv.services.common.traces import (
    TraceFormatError,
    load_azure,
    load_burstgpt,
    load_mooncake,
    load_trace,
    trace_format,
)
from speckv.services.common.traces.azure import parse_timestamp

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_real_azure_rows(traces_dir):
    requests = load_azure(traces_dir / "AzureLLMInferenceTrace_code.csv", duration_s=60.0)
    assert requests and requests[0].arrival_s == 0.0
    assert all(0 <= r.arrival_s < 60 for r in requests)
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    # README: first row 2023-11-16 18:17:03.9799600, 4808 context, 10 generated tokens
    first = requests[0]
    assert (first.prompt_tokens, first.output_tokens, first.family) == (4808, 10, "azure-code")
    assert first.block_hashes == () and first.full_blocks == 0
    assert requests[1].arrival_s == pytest.approx(0.052, abs=1e-6)


def test_seven_digit_fractions_parse_exactly():
    assert parse_timestamp("2023-11-16 18:17:03.9799600") - parse_timestamp("2023-11-16 18:17:03") == \
        pytest.approx(0.97996, abs=1e-7)


@pytest.mark.parametrize("row, fragment", [
    ("2023-11-16 18:17:xx.1,1,1", "TIMESTAMP"),
    ("2023-11-16 18:17:04.1,ten,1", "ContextTokens='ten'"),
    ("2023-11-16 18:17:04.1,5,-1", "GeneratedTokens=-1"),
    ("2023-11-16 18:17:04.1,5", "2 columns"),
])
def test_malformed_azure_rows_name_file_and_line(tmp_path, row, fragment):
    path = tmp_path / "AzureLLMInferenceTrace_x.csv"
    path.write_text(AZURE_HEADER + "2023-11-16 18:17:03.9799600,4808,10\n" + row + "\n")
    with pytest.raises(TraceFormatError, match=f"_x.csv:3: .*{fragment}"):
        load_azure(path)


def test_azure_header_is_checked(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("time,context,generated\n")
    with pytest.raises(TraceFormatError, match="a.csv:1: header"):
        load_azure(path)


def test_burstgpt_rows_in_the_published_shape(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURST_HEADER + "5,ChatGPT,472,18,490,Conversation log\n"
                    "3,GPT-4,1200,0,1200,API log\n" "9,ChatGPT,30,200,230,Conversation log\n")
    requests = load_burstgpt(path)
    assert [r.arrival_s for r in requests] == [3.0, 5.0, 9.0]
    assert [r.family for r in requests] == ["burstgpt-gpt-4-api-log", "burstgpt-chatgpt-conversation-log",
                                            "burstgpt-chatgpt-conversation-log"]
    assert (requests[1].prompt_tokens, requests[1].output_tokens) == (472, 18)
    assert trace_format(path) == "burstgpt" and len(load_trace(path)) == 3
    assert [r.arrival_s for r in load_burstgpt(path, start_s=4, duration_s=5)] == [5.0]


@pytest.mark.parametrize("row, fragment", [
    ("x,ChatGPT,1,1,2,Conversation log", "Timestamp='x'"),
    ("-2,ChatGPT,1,1,2,Conversation log", "Timestamp=-2"),
    ("1,ChatGPT,1.5,1,2,Conversation log", "Request tokens='1.5'"),
    ("1,,1,1,2,Conversation log", "Model and Log Type"),
    ("1,ChatGPT,1,1", "columns"),
])
def test_malformed_burstgpt_rows_name_file_and_line(tmp_path, row, fragment):
    path = tmp_path / "b.csv"
    path.write_text(BURST_HEADER + "5,ChatGPT,472,18,490,Conversation log\n" + row + "\n")
    with pytest.raises(TraceFormatError, match=f"b.csv:3: .*{fragment}"):
        load_burstgpt(path)


def test_burstgpt_header_missing_columns(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Log Type\n1,ChatGPT,API log\n")
    with pytest.raises(TraceFormatError, match="b.csv:1: .*Request tokens"):
        load_burstgpt(path)


def test_mooncake_conversation_family_follows_the_growing_chain(traces_dir):
    requests = load_mooncake(traces_dir / "mooncake_conversation_trace.jsonl", duration_s=900.0,
                             family="conversation")
    by_family = collections.defaultdict(list)
    for r in requests:
        by_family[r.family].append(r)
    assert 1 < len(by_family) < len(requests)  # some conversations continue
    continued = [turns for turns in by_family.values() if len(turns) > 1]
    assert continued
    for turns in continued:
        # later turns extend the first turn's prefix: they share its first two blocks
        assert all(t.block_hashes[:2] == turns[0].block_hashes[:2] for t in turns)
    assert trace_format(traces_dir / "mooncake_conversation_trace.jsonl") == "mooncake"
    with pytest.raises(ValueError, match="family"):
        load_mooncake(traces_dir / "mooncake_conversation_trace.jsonl", family="tenant")


def test_load_trace_refuses_prefix_families_where_a_trace_has_none(traces_dir):
    with pytest.raises(ValueError, match="no prefix information"):
        load_trace(traces_dir / "AzureLLMInferenceTrace_code.csv", family="conversation")
