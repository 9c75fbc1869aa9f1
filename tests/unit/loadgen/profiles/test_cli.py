from __future__ import annotations

import json

import pytest

from speckv.loadgen.profiles import cli as profile_cli
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import InvalidArgument
from tests.support.vidur_tables import (
    OP_COSTS,
    SHAPE,
    layer_intercept_ms,
    layer_slope_ms,
    mlp_row,
    write_all_reduce,
    write_mlp,
)

SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, *range(512, 8193, 256)]


def vidur_dir(tmp_path, model="acme/lm", gpu="h100", tp=1, scale=1.0):
    write_mlp(tmp_path / "data/profiling/compute" / gpu / model / "mlp.csv",
              [mlp_row(n, tp=tp, scale=scale) for n in SIZES])
    return tmp_path


def test_a_fit_recovers_the_tables_linear_costs_and_writes_a_loadable_profile(tmp_path, capsys):
    root = vidur_dir(tmp_path)
    out = tmp_path / "profile.json"
    argv = ["fit", "--vidur-dir", str(root), "--model", "acme/lm", "--gpu", "h100", "--layers", "3",
            "--vidur-commit", "a" * 40, "--json", str(out)]
    assert profile_cli.main(argv, {}) == 0
    entry = json.loads(out.read_text())["lm-h100-vidur"]
    emb_base, emb_per_token = OP_COSTS["emb"]
    lm_head_ms = SHAPE["vocab_size"] * SHAPE["n_embd"] * 2 / (3350e9) * 1e3
    assert entry["ms_per_token"] == pytest.approx(3 * layer_slope_ms() + emb_per_token, rel=1e-6)
    assert entry["overhead_ms"] == pytest.approx(3 * layer_intercept_ms() + emb_base + lm_head_ms, abs=1e-4)
    assert entry["provenance"]["held_out_error"]["max"] == pytest.approx(0.0, abs=1e-6)
    assert entry["provenance"]["files"] == ["data/profiling/compute/h100/acme/lm/mlp.csv"]
    assert "--json" not in entry["provenance"]["command"] and "--vidur-dir DIR" in entry["provenance"]["command"]
    # 3 layers x 4 heads x 64 dims x 4 FLOP a pair at 602 TFLOP/s.
    assert entry["ms_per_token_pair"] == pytest.approx(3 * 4 * 64 * 4 / 602e12 * 1e3, rel=1e-3)
    assert entry["decode"]["ms_per_seq"] == pytest.approx(3 * layer_slope_ms() + emb_per_token, rel=1e-6)
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"profiles": json.loads(out.read_text())}))
    loaded = get_profile("lm-h100-vidur", profiles)
    assert loaded.measured and loaded.geometry.num_kv_heads == 2 and loaded.geometry.head_dim == 64
    assert "held-out error" in capsys.readouterr().out


def test_tensor_parallelism_adds_two_all_reduces_a_layer(tmp_path):
    root = vidur_dir(tmp_path, tp=2)
    # Flat 0.1 ms per all-reduce at every size the batches need.
    write_all_reduce(root / "data/profiling/network/h100_dgx/all_reduce.csv", 2, {1: 0.1, 10**9: 0.1})
    out = tmp_path / "p.json"
    profile_cli.main(["fit", "--vidur-dir", str(root), "--model", "acme/lm", "--gpu", "h100", "--tp", "2",
                      "--layers", "3", "--json", str(out)], {})
    entry = json.loads(out.read_text())["lm-h100-tp2-vidur"]
    lm_head_ms = SHAPE["vocab_size"] * SHAPE["n_embd"] * 2 / (3350e9 * 2) * 1e3
    expected = 3 * layer_intercept_ms() + OP_COSTS["emb"][0] + 2 * 3 * 0.1 + lm_head_ms
    assert entry["overhead_ms"] == pytest.approx(expected, abs=1e-4)
    assert entry["tensor_parallel"] == 2 and entry["provenance"]["files"][-1].endswith("all_reduce.csv")


def test_a_model_not_profiled_on_the_gpu_is_scaled_from_one_that_was(tmp_path):
    root = vidur_dir(tmp_path, model="acme/lm", gpu="a100")
    vidur_dir(root, model="acme/ref", gpu="h100", scale=0.5)
    vidur_dir(root, model="acme/ref", gpu="a100")
    by_shape, by_gpu = tmp_path / "s.json", tmp_path / "g.json"
    common = ["fit", "--vidur-dir", str(root), "--model", "acme/lm", "--gpu", "h100", "--layers", "3",
              "--scale-from", "acme/ref"]
    profile_cli.main([*common, "--json", str(by_shape)], {})
    profile_cli.main([*common, "--scale-by", "gpu", "--json", str(by_gpu)], {})
    shape_entry = json.loads(by_shape.read_text())["lm-h100-vidur"]
    gpu_entry = json.loads(by_gpu.read_text())["lm-h100-vidur"]
    # Same shapes here, so both ways give the reference's h100 times: half the a100 ones.
    half_slope = 0.5 * (3 * layer_slope_ms() + OP_COSTS["emb"][1])
    assert shape_entry["ms_per_token"] == pytest.approx(half_slope, rel=1e-6)
    assert gpu_entry["ms_per_token"] == pytest.approx(half_slope, rel=1e-6)
    assert shape_entry["provenance"]["scaling"].startswith("by shape")
    assert gpu_entry["provenance"]["scaling"].startswith("by GPU") and len(gpu_entry["provenance"]["files"]) == 3


def test_a_missing_or_malformed_table_names_the_file_and_line(tmp_path):
    argv = ["fit", "--vidur-dir", str(tmp_path), "--model", "acme/lm", "--gpu", "h100", "--layers", "2"]
    with pytest.raises(InvalidArgument, match=r"compute/h100/acme/lm/mlp.csv: no such file"):
        profile_cli.main(argv, {})
    rows = [mlp_row(n) for n in SIZES]
    rows[4]["num_tokens"] = "sixteen"
    path = write_mlp(tmp_path / "data/profiling/compute/h100/acme/lm/mlp.csv", rows)
    with pytest.raises(InvalidArgument, match=rf"{path}:6: column num_tokens: 'sixteen' is not an integer"):
        profile_cli.main(argv, {})


def test_an_unknown_model_needs_its_layers_and_a_throughput_needs_its_source(tmp_path):
    root = vidur_dir(tmp_path)
    with pytest.raises(InvalidArgument, match="pass --layers"):
        profile_cli.main(["fit", "--vidur-dir", str(root), "--model", "acme/lm", "--gpu", "h100"], {})
    with pytest.raises(InvalidArgument, match="--attention-source"):
        profile_cli.main(["fit", "--vidur-dir", str(root), "--model", "acme/lm", "--gpu", "h100", "--layers", "2",
                          "--attention-tflops", "500"], {})
