from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from speckv.services.common.engine_profile import (
    DEFAULT_PROFILES_PATH,
    PROVENANCE_KEYS,
    get_profile,
    load_profiles,
)
from speckv.services.common.errors import InvalidArgument

REPO_ROOT = Path(__file__).resolve().parents[4]

SPEC = {"model": "m", "overhead_ms": 1.0, "ms_per_token": 0.01, "ms_per_token_pair": 1e-6,
        "geometry": {"num_layers": 2, "num_kv_heads": 2, "head_dim": 8, "dtype": "float16", "block_size": 4},
        "source": "a citation"}


def write_profiles(tmp_path, **profiles):
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"profiles": profiles}))
    return path


def test_every_committed_profile_loads_and_says_where_it_comes_from():
    profiles = load_profiles()
    assert all(p.source.strip() for p in profiles.values())
    # The datasheet approximation stays, named as such, beside the fitted profiles.
    datasheet = profiles["llama-3-8b-h100"]
    assert not datasheet.measured and datasheet.source.startswith("Datasheet approximation")
    fitted = {name: p for name, p in profiles.items() if p.measured}
    assert {"llama-3-8b-h100-vidur", "llama-3-8b-a100-vidur", "llama-2-70b-h100-tp4-vidur"} <= set(fitted)
    assert fitted["llama-2-70b-h100-tp4-vidur"].tensor_parallel == 4


def test_fitted_profiles_name_files_commit_scaling_error_and_attention():
    raw = json.loads(DEFAULT_PROFILES_PATH.read_text())["profiles"]
    for name, spec in raw.items():
        if spec.get("measured"):
            provenance = spec["provenance"]
            assert all(provenance[key] for key in PROVENANCE_KEYS), name
            assert len(provenance["commit"]) == 40
            if name.endswith("-vidur"):  # fitted to Vidur's tables: its files
                assert provenance["files"][0].startswith("data/profiling/")
            else:  # measured on a real engine here: the measuring code's files
                assert all((REPO_ROOT / path).is_file() for path in provenance["files"]), name
            assert 0 <= provenance["held_out_error"]["mean"] <= provenance["held_out_error"]["max"]


@pytest.mark.parametrize("source", [None, "", "   "])
def test_a_profile_without_a_source_is_refused(tmp_path, source):
    spec = dict(SPEC)
    if source is None:
        del spec["source"]
    else:
        spec["source"] = source
    path = write_profiles(tmp_path, nameless=spec)
    with pytest.raises(InvalidArgument, match=rf"engine profile 'nameless' in {path} has no source"):
        load_profiles(path)


def test_a_measured_profile_without_provenance_is_refused(tmp_path):
    spec = {**SPEC, "measured": True, "provenance": {"files": ["data/x.csv"], "commit": "abc"}}
    path = write_profiles(tmp_path, fitted=spec)
    with pytest.raises(InvalidArgument, match="provenance lacks scaling, held_out_error, attention"):
        load_profiles(path)
    full = copy.deepcopy(spec)
    full["provenance"].update({"scaling": "none", "held_out_error": {"max": 0.1}, "attention": "a paper"})
    assert get_profile("fitted", write_profiles(tmp_path, fitted=full)).measured


def test_tensor_parallel_defaults_to_one_and_must_be_positive(tmp_path):
    assert get_profile("p", write_profiles(tmp_path, p=SPEC)).tensor_parallel == 1
    with pytest.raises(InvalidArgument, match="tensor_parallel must be >= 1"):
        load_profiles(write_profiles(tmp_path, p={**SPEC, "tensor_parallel": 0}))
