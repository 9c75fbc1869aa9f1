"""`speckv simulate --sweep`: parsing, the cells' product, each cell's
resolved configuration (differing from another cell's in the swept key
alone, with what a profile implies following it), and the errors a bad key
or value gets before any worker starts."""
from __future__ import annotations

import dataclasses

import pytest

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.sim.sweep import (
    Sweep,
    cell_config,
    cell_keys,
    cell_label,
    parse_sweeps,
    resolve_cells,
)
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.links import get_link

LINKS = "link=tcp-25g,eth-100g,rdma-400g"
PROFILES = "profile=llama-3-8b-h100-vidur,llama-2-70b-h100-tp4-vidur"


def differing(a: dict, b: dict) -> set[str]:
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def test_parse_keeps_keys_and_values_in_order():
    assert parse_sweeps([LINKS, " profile = a , b "]) == [
        Sweep("link", ("tcp-25g", "eth-100g", "rdma-400g")), Sweep("profile", ("a", "b"))]
    assert parse_sweeps([]) == []


@pytest.mark.parametrize("spec, message", [
    ("model=llama", "unknown key 'model'; sweepable keys: link, profile"),
    ("link", "expected KEY=V1,V2"),
    ("=tcp-25g", "expected KEY=V1,V2"),
    ("link=", "none empty"),
    ("link=tcp-25g,,eth-100g", "none empty"),
    ("link=tcp-25g,tcp-25g", "name each value once"),
])
def test_malformed_sweeps_are_invalid_argument(spec, message):
    with pytest.raises(InvalidArgument, match=message):
        parse_sweeps([spec])


def test_a_key_swept_twice_is_refused():
    with pytest.raises(InvalidArgument, match="given twice"):
        parse_sweeps(["link=tcp-25g", "link=eth-100g"])


def test_cells_are_the_product_first_sweep_outermost_in_one_spelling():
    keys = cell_keys(parse_sweeps([PROFILES, LINKS]))
    assert len(keys) == 6
    # Pairs are in SWEEP_KEYS order whatever the flags' order, so a cell has one label.
    assert keys[0] == (("link", "tcp-25g"), ("profile", "llama-3-8b-h100-vidur"))
    assert keys[1] == (("link", "eth-100g"), ("profile", "llama-3-8b-h100-vidur"))
    assert keys[3] == (("link", "tcp-25g"), ("profile", "llama-2-70b-h100-tp4-vidur"))
    assert len(set(keys)) == 6
    assert cell_label(keys[0]) == "tcp-25g / llama-3-8b-h100-vidur" and cell_label(()) == "base"


@pytest.mark.parametrize("spec, message", [
    ("link=tcp-25g,infiniband-9000", "unknown 'infiniband-9000'; available: eth-100g, rdma-400g, tcp-25g"),
    ("profile=gpt-9-h100", "unknown 'gpt-9-h100'; available: .*llama-3-8b-h100"),
    # A datasheet profile of another model has no decode step to derive its decode cost from.
    ("profile=tiny", "no fitted decode step"),
])
def test_unknown_values_are_refused_when_resolved(spec, message):
    with pytest.raises(InvalidArgument, match=message):
        resolve_cells(parse_sweeps([spec]))


def test_two_link_cells_differ_in_the_link_alone():
    cells = resolve_cells(parse_sweeps([LINKS, PROFILES]))  # link outermost: the profile turns first
    tcp, eth = cells[0], cells[2]
    assert (tcp.value("link"), eth.value("link")) == ("tcp-25g", "eth-100g")
    assert tcp.value("profile") == eth.value("profile")
    assert differing(tcp.view, eth.view) == {"link"}
    # The configuration the workers run on, field by field: the node link alone.
    fields = {f.name for f in dataclasses.fields(tcp.config)
              if getattr(tcp.config, f.name) != getattr(eth.config, f.name)}
    assert fields == {"link"}
    assert eth.config.link == get_link("eth-100g").model(1)


def test_two_profile_cells_differ_in_the_profile_alone_and_its_model_follows():
    cells = resolve_cells(parse_sweeps([LINKS, PROFILES]))
    small, large = cells[0], cells[1]
    assert small.value("link") == large.value("link") == "tcp-25g"
    assert differing(small.view, large.view) == {"profile"}
    seventy = get_profile("llama-2-70b-h100-tp4-vidur")
    assert large.config.profile == seventy
    # The model's KV: 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 320 KiB a token, at the config's block.
    assert large.config.real_geometry.bytes_per_token == 327_680 == 2.5 * small.config.real_geometry.bytes_per_token
    assert large.config.real_geometry.block_size == small.config.real_geometry.block_size == 512
    # Four GPUs: four NICs and four PCIe links, four HBMs; its fitted decode step.
    assert large.config.link.gbps == 4 * small.config.link.gbps == 100.0
    assert large.config.host_link.gbps == 4 * small.config.host_link.gbps
    assert large.config.engine.hbm_gb_per_s == 4 * 3350.0
    assert large.config.engine.decode_weights_ms == pytest.approx(21.2244)
    assert small.config.engine.decode_weights_ms == pytest.approx(6.2606)
    # Pool sizes stay in blocks; everything that is no profile's stays.
    assert (large.config.pool_pages, large.config.host_pages) == (small.config.pool_pages, small.config.host_pages)
    assert large.view["cluster"] == small.view["cluster"] and large.view["engine"] == small.view["engine"]


def test_the_base_values_resolve_to_the_base_configuration():
    base = load_e2e_config()
    (cell,) = resolve_cells(parse_sweeps(["link=tcp-25g", "profile=llama-3-8b-h100"]))
    assert cell.config == base
    assert cell_config(None, cell.key) == base == cell_config(None, ())


def test_a_worker_rebuilds_the_same_cell_configuration():
    for cell in resolve_cells(parse_sweeps([LINKS, PROFILES])):
        assert cell_config(None, cell.key) == cell.config
