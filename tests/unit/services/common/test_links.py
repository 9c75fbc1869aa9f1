from __future__ import annotations

import json

import pytest

from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.links import SOURCED_FIELDS, get_link, load_links


def write_links(tmp_path, **links):
    path = tmp_path / "links.json"
    path.write_text(json.dumps({"links": links}))
    return path


def sourced(**figures):
    return {**figures, "sources": {key: f"where {key} comes from" for key in SOURCED_FIELDS}}


def test_the_committed_links_load_with_a_source_for_every_figure():
    links = load_links()
    assert {"tcp-25g", "eth-100g", "rdma-400g"} <= set(links)
    for link in links.values():
        assert all(link.sources[key].strip() for key in SOURCED_FIELDS)
        assert 0 < link.effective_fraction <= 1


def test_tcp_25g_is_exactly_the_link_every_committed_result_used():
    assert get_link("tcp-25g").model() == LinkModel(25.0, 1.0)


def test_effective_bandwidth_is_the_line_rate_times_its_fraction():
    assert get_link("eth-100g").gbps == pytest.approx(87.0)
    assert get_link("rdma-400g").gbps == pytest.approx(190.0)


def test_an_engine_of_several_gpus_has_one_link_each(tmp_path):
    link = get_link("x", write_links(tmp_path, x=sourced(line_gbps=100, effective_fraction=0.5, overhead_ms=0.2)))
    assert link.model(4) == LinkModel(200.0, 0.2)
    with pytest.raises(InvalidArgument, match="at least one GPU"):
        link.model(0)


def test_a_link_without_sources_is_refused(tmp_path):
    path = write_links(tmp_path, bare={"line_gbps": 25, "effective_fraction": 1.0, "overhead_ms": 1.0})
    with pytest.raises(InvalidArgument, match=rf"link 'bare' in {path} has no sources"):
        load_links(path)


def test_a_figure_without_its_source_is_refused_by_name(tmp_path):
    spec = sourced(line_gbps=25, effective_fraction=1.0, overhead_ms=1.0)
    spec["sources"]["effective_fraction"] = "  "
    del spec["sources"]["overhead_ms"]
    path = write_links(tmp_path, half=spec)
    with pytest.raises(InvalidArgument, match=r"link 'half' .*no source for effective_fraction, overhead_ms"):
        load_links(path)


@pytest.mark.parametrize("figures", [
    {"line_gbps": 0, "effective_fraction": 1.0, "overhead_ms": 1.0},
    {"line_gbps": 25, "effective_fraction": 1.5, "overhead_ms": 1.0},
    {"line_gbps": 25, "effective_fraction": 1.0, "overhead_ms": -1.0},
])
def test_impossible_figures_are_refused(tmp_path, figures):
    with pytest.raises(InvalidArgument, match="line_gbps > 0"):
        load_links(write_links(tmp_path, bad=sourced(**figures)))


def test_a_missing_figure_or_unknown_name_is_clear(tmp_path):
    path = write_links(tmp_path, short=sourced(line_gbps=25, overhead_ms=1.0))
    with pytest.raises(InvalidArgument, match="bad or missing field .'effective_fraction'"):
        load_links(path)
    with pytest.raises(InvalidArgument, match="link='nope' is unknown; available: eth-100g, rdma-400g, tcp-25g"):
        get_link("nope")
    with pytest.raises(InvalidArgument, match="non-empty 'links'"):
        load_links(write_links(tmp_path))
