from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.loadgen.profiles.vidur_csv import (
    EMBEDDING,
    LAYER_OPERATORS,
    ModelShape,
    forward_ms,
    gpu_ratio,
    read_all_reduce,
    read_layer_times,
)
from tests.support.vidur_tables import (
    OP_COSTS,
    SHAPE,
    layer_intercept_ms,
    layer_slope_ms,
    mlp_header,
    mlp_row,
    write_all_reduce,
    write_mlp,
)


def test_a_table_reads_into_per_operator_medians(tmp_path):
    path = write_mlp(tmp_path / "mlp.csv", [mlp_row(n) for n in (1, 2, 4, 512)] + [mlp_row(8, tp=2)])
    times = read_layer_times(path)
    assert times.tokens.tolist() == [1, 2, 4, 512] and times.tensor_parallel == 1
    assert times.shape.n_embd == 256 and times.shape.head_dim == 64 and times.shape.gated_mlp
    assert times.layer_ms() == pytest.approx(layer_intercept_ms() + layer_slope_ms() * times.tokens)
    assert times.ops[EMBEDDING][0] == pytest.approx(sum(OP_COSTS[EMBEDDING]))
    assert times.files == (str(path),)


def test_repeated_batch_sizes_merge_by_their_median(tmp_path):
    path = write_mlp(tmp_path / "mlp.csv", [mlp_row(4, scale=s) for s in (1.0, 2.0, 10.0)] + [mlp_row(8)])
    times = read_layer_times(path)
    assert times.tokens.tolist() == [4, 8]
    assert times.ops["add"][0] == pytest.approx(2.0 * (OP_COSTS["add"][0] + OP_COSTS["add"][1] * 4))


def test_a_missing_table_names_the_file(tmp_path):
    path = tmp_path / "data/profiling/compute/h100/acme/m/mlp.csv"
    with pytest.raises(InvalidArgument, match=rf"{path}: no such file"):
        read_layer_times(path)


def test_a_missing_column_names_the_file_and_the_header_line(tmp_path):
    path = write_mlp(tmp_path / "mlp.csv", [mlp_row(1)])
    text = path.read_text().replace("time_stats.mlp_up_proj.median", "time_stats.mlp_up_proj.p50")
    path.write_text(text)
    with pytest.raises(InvalidArgument, match=rf"{path}:1: missing column\(s\) time_stats.mlp_up_proj.median"):
        read_layer_times(path)


def test_a_malformed_value_names_the_file_line_and_column(tmp_path):
    rows = [mlp_row(1), mlp_row(2)]
    rows[1]["time_stats.add.median"] = "fast"
    path = write_mlp(tmp_path / "mlp.csv", rows)
    # Line 1 is the header, so the second data row is line 3.
    with pytest.raises(InvalidArgument, match=rf"{path}:3: column time_stats.add.median: 'fast' is not a number"):
        read_layer_times(path)


def test_a_negative_time_or_token_count_is_malformed(tmp_path):
    rows = [mlp_row(1), mlp_row(2)]
    rows[0]["time_stats.emb.median"] = -1.0
    path = write_mlp(tmp_path / "mlp.csv", rows)
    with pytest.raises(InvalidArgument, match=rf"{path}:2: column time_stats.emb.median"):
        read_layer_times(path)
    rows = [mlp_row(1), mlp_row(0)]
    path = write_mlp(tmp_path / "zero.csv", rows)
    with pytest.raises(InvalidArgument, match=rf"{path}:3: num_tokens=0"):
        read_layer_times(path)


def test_a_git_lfs_pointer_is_not_data(tmp_path):
    path = tmp_path / "mlp.csv"
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    with pytest.raises(InvalidArgument, match="Git LFS pointer"):
        read_layer_times(path)


def test_an_empty_file_and_an_absent_degree_are_clear(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InvalidArgument, match=rf"{empty}:1: empty file"):
        read_layer_times(empty)
    path = write_mlp(tmp_path / "mlp.csv", [mlp_row(1, tp=1), mlp_row(1, tp=2)])
    with pytest.raises(InvalidArgument, match="no rows with num_tensor_parallel_workers=4 .the file has 1, 2"):
        read_layer_times(path, tensor_parallel=4)


def test_the_header_alone_is_the_expected_vidur_layout():
    header = mlp_header()
    assert "time_stats.attn_pre_proj.median" in header and "num_tensor_parallel_workers" in header


def test_scaling_by_shape_multiplies_each_operator_by_its_work_ratio(tmp_path):
    times = read_layer_times(write_mlp(tmp_path / "mlp.csv", [mlp_row(n) for n in (1, 64)]))
    scaled = times.scaled_to(replace(times.shape, n_expanded_embd=2 * times.shape.n_expanded_embd))
    for op in ("mlp_up_proj", "mlp_down_proj", "mlp_act"):
        assert scaled.ops[op] == pytest.approx(2 * times.ops[op])
    for op in ("attn_pre_proj", "attn_post_proj", "attn_rope", "input_layernorm", "add", EMBEDDING):
        assert scaled.ops[op] == pytest.approx(times.ops[op])


def test_fewer_kv_heads_shrink_the_qkv_projection_and_rope():
    mha = ModelShape(32, 32, 4096, 11008, 32768, True)
    gqa = ModelShape(32, 8, 4096, 14336, 128256, True)
    # q + k + v output widths: 3 x 4096 against 4096 + 2 x 1024.
    assert gqa.work_per_token("attn_pre_proj") / mha.work_per_token("attn_pre_proj") == pytest.approx(0.5)
    assert gqa.work_per_token("attn_rope") / mha.work_per_token("attn_rope") == pytest.approx(40 / 64)
    assert gqa.work_per_token("mlp_up_proj") / mha.work_per_token("mlp_up_proj") == pytest.approx(14336 / 11008)


def test_scaling_by_gpu_applies_the_reference_models_speed_up(tmp_path):
    target_there = read_layer_times(write_mlp(tmp_path / "a.csv", [mlp_row(n, scale=3.0) for n in (1, 2, 4)]))
    reference_here = read_layer_times(write_mlp(tmp_path / "b.csv", [mlp_row(n) for n in (2, 4, 8)]))
    reference_there = read_layer_times(write_mlp(tmp_path / "c.csv", [mlp_row(n, scale=2.0) for n in (2, 4)]))
    moved = gpu_ratio(target_there, reference_here, reference_there)
    assert moved.tokens.tolist() == [2, 4]  # the sizes all three share
    for op in LAYER_OPERATORS:
        assert moved.ops[op] == pytest.approx(1.5 * reference_here.at(np.array([2, 4])).ops[op])
    assert len(moved.files) == 3


def test_a_forward_pass_adds_layers_all_reduces_and_the_embedding(tmp_path):
    times = read_layer_times(write_mlp(tmp_path / "mlp.csv", [mlp_row(n, tp=2) for n in (1, 128)]), 2)
    # 1 and 128 tokens of 256 x 2-byte activations: 512 and 65,536 bytes.
    all_reduce = read_all_reduce(write_all_reduce(tmp_path / "ar.csv", 2, {512: 0.01, 65536: 0.05}), 2)
    total = forward_ms(times, 3, all_reduce)
    expected = 3 * times.layer_ms() + times.ops[EMBEDDING] + 2 * 3 * np.array([0.01, 0.05])
    assert total == pytest.approx(expected)
    with pytest.raises(InvalidArgument, match="all-reduce"):
        forward_ms(times, 3, None)


def test_all_reduce_rows_of_other_gpu_counts_are_left_out(tmp_path):
    path = write_all_reduce(tmp_path / "ar.csv", 4, {1024: 0.02, 2048: 0.04})
    times = read_all_reduce(path, 4)
    assert times.sizes.tolist() == [1024, 2048] and times.ms.tolist() == [0.02, 0.04]
    assert times.at_bytes(np.array([1536, 4096])) == pytest.approx([0.03, 0.08])  # beyond: in proportion
    with pytest.raises(InvalidArgument, match="num_workers = devices_per_node = 3"):
        read_all_reduce(path, 3)


def test_shape_columns_must_agree_across_rows(tmp_path):
    rows = [mlp_row(1), mlp_row(2, shape={**SHAPE, "n_embd": 512})]
    path = write_mlp(tmp_path / "mlp.csv", rows)
    with pytest.raises(InvalidArgument, match=rf"{path}:3: model shape"):
        read_layer_times(path)
