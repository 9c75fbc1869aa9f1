import json

import pytest

from speckv.services.common.disks import get_disk, load_disks, serial
from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.errors import InvalidArgument


def test_packaged_profiles_have_gen4_gen5_and_this_machine_each_figure_sourced():
    disks = load_disks()
    assert {"nvme-gen4", "nvme-gen5", "this-vm"} <= set(disks)
    assert disks["nvme-gen5"].read_gbytes_s > disks["nvme-gen4"].read_gbytes_s > disks["this-vm"].read_gbytes_s
    assert disks["this-vm"].sources["read_gbytes_s"].startswith("MEASURED")
    assert disks["nvme-gen4"].drives_per_gpu == 1


def test_model_is_the_engine_s_drives_in_gbit_per_s():
    gen4 = get_disk("nvme-gen4")
    assert gen4.gbytes_s == pytest.approx(6.5 * 0.8)
    assert gen4.model(4).gbps == pytest.approx(6.5 * 0.8 * 8 * 4)
    assert gen4.model(1).overhead_ms == gen4.overhead_ms
    with pytest.raises(InvalidArgument, match="at least one GPU"):
        gen4.model(0)


def test_serial_adds_overheads_and_times_per_byte():
    first, then = LinkModel(10.0, 0.5), LinkModel(40.0, 0.25)
    both = serial(first, then)
    for nbytes in (0, 1 << 20, 3 << 30):
        assert both.transfer_ms(nbytes) == pytest.approx(first.transfer_ms(nbytes) + then.transfer_ms(nbytes))


def _write(tmp_path, spec):
    path = tmp_path / "disks.json"
    path.write_text(json.dumps({"disks": {"d": spec}}))
    return path


SOURCES = {"read_gbytes_s": "x", "effective_fraction": "x", "drives_per_gpu": "x", "overhead_ms": "x"}


def test_a_figure_without_its_source_is_refused_naming_it(tmp_path):
    spec = {"read_gbytes_s": 7, "effective_fraction": 1, "drives_per_gpu": 1, "overhead_ms": 0.1,
            "sources": {k: v for k, v in SOURCES.items() if k != "drives_per_gpu"}}
    with pytest.raises(InvalidArgument, match="no source for drives_per_gpu"):
        load_disks(_write(tmp_path, spec))


@pytest.mark.parametrize("field,value", [("read_gbytes_s", 0), ("effective_fraction", 1.5),
                                         ("drives_per_gpu", 0), ("overhead_ms", -1)])
def test_bad_figures_are_refused(tmp_path, field, value):
    spec = {"read_gbytes_s": 7, "effective_fraction": 1, "drives_per_gpu": 1, "overhead_ms": 0.1, "sources": SOURCES}
    spec[field] = value
    with pytest.raises(InvalidArgument, match="needs read_gbytes_s > 0"):
        load_disks(_write(tmp_path, spec))


def test_unknown_name_lists_the_choices():
    with pytest.raises(InvalidArgument, match="nvme-gen4"):
        get_disk("floppy")
