from __future__ import annotations

import json

import pytest

from speckv.services.common.errors import NotFound
from speckv.services.common.traces import TraceFormatError, load_mooncake, resolve_traces_dir


def test_real_conversation_trace_slice(traces_dir):
    requests = load_mooncake(traces_dir / "mooncake_conversation_trace.jsonl", start_s=0.0, duration_s=30.0)
    assert requests, "the first 30 s of the trace hold requests"
    assert all(0.0 <= r.arrival_s < 30.0 for r in requests)
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    for r in requests:
        # README: len(hash_ids) == ceil(input_length / 512)
        assert len(r.block_hashes) == -(-r.prompt_tokens // 512)
        assert r.full_blocks == r.prompt_tokens // 512
        assert r.family == str(r.block_hashes[0])


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("{not json", "not JSON"),
        (json.dumps({"timestamp": 1, "input_length": 5, "output_length": 1}), "missing field 'hash_ids'"),
        (json.dumps({"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}), "timestamp=-1"),
        (json.dumps({"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}), "hash_ids"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, line, fragment):
    path = tmp_path / "t.jsonl"
    good = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]})
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=f"t.jsonl:2: .*{fragment}"):
        load_mooncake(path)


def test_traces_dir_resolution(tmp_path):
    assert resolve_traces_dir(str(tmp_path), {}) == tmp_path
    assert resolve_traces_dir(None, {"SPECKV_TRACES": str(tmp_path)}) == tmp_path
    with pytest.raises(NotFound, match="SPECKV_TRACES"):
        resolve_traces_dir(str(tmp_path / "missing"), {})
