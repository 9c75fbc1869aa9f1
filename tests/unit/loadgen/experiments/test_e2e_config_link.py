"""The committed cluster names its link by profile, resolving to exactly the
figures every committed result was produced with."""
from __future__ import annotations

import json

import pytest

from speckv.loadgen.experiments.e2e_config import DEFAULT_E2E_PATH, load_e2e_config
from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.errors import InvalidArgument


def variant(tmp_path, **cluster_changes):
    raw = json.loads(DEFAULT_E2E_PATH.read_text())
    for key, value in cluster_changes.items():
        if value is None:
            raw["cluster"].pop(key, None)
        else:
            raw["cluster"][key] = value
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps(raw))
    return path, raw


def test_the_committed_cluster_names_tcp_25g_and_resolves_to_the_old_link():
    raw = json.loads(DEFAULT_E2E_PATH.read_text())
    assert raw["cluster"]["link"] == "tcp-25g" and "link_gbps" not in raw["cluster"]
    assert load_e2e_config().link == LinkModel(25.0, 1.0)


def test_older_files_with_the_figures_themselves_still_load(tmp_path):
    path, _ = variant(tmp_path, link=None, link_gbps=25.0, link_overhead_ms=1.0)
    assert load_e2e_config(path).link == load_e2e_config().link


def test_another_named_link_resolves_through_links_json(tmp_path):
    path, _ = variant(tmp_path, link="rdma-400g")
    assert load_e2e_config(path).link.gbps == pytest.approx(190.0)


def test_a_tensor_parallel_engine_gets_one_link_per_gpu(tmp_path):
    path, raw = variant(tmp_path, link="tcp-25g")
    raw["model"]["engine_profile"] = "llama-2-70b-h100-tp4-vidur"
    path.write_text(json.dumps(raw))
    assert load_e2e_config(path).link == LinkModel(100.0, 1.0)


def test_a_name_and_figures_together_or_an_unknown_name_are_refused(tmp_path):
    path, _ = variant(tmp_path, link_gbps=100.0)
    with pytest.raises(InvalidArgument, match="cluster.link names a link profile; drop cluster.link_gbps"):
        load_e2e_config(path)
    path, _ = variant(tmp_path, link="carrier-pigeon")
    with pytest.raises(InvalidArgument, match=rf"e2e config {path}: cluster.link: link='carrier-pigeon' is unknown"):
        load_e2e_config(path)
