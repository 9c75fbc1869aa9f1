"""The machine entry of speckv simulate's JSON: a speed reference that
scales with the work it times, and the CPU model read from cpuinfo."""
from __future__ import annotations

import pytest

from speckv.loadgen.sim import machine


def test_the_reference_times_its_loop():
    assert machine.reference_loop_ms(repeats=1) > 0
    with pytest.raises(ValueError):
        machine.reference_loop_ms(repeats=0)


def test_the_reference_grows_with_the_work(monkeypatch):
    base = machine.reference_loop_ms(repeats=3)
    monkeypatch.setattr(machine, "REFERENCE_STATEMENT", "sum(range(20_000_000))")
    assert machine.reference_loop_ms(repeats=1) > 5 * base  # 20x the work; noise cannot close that gap


def test_the_cpu_model_comes_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\n\nprocessor\t: 1\n")
    assert machine.cpu_model(info) == "AMD EPYC 9B14"
    assert isinstance(machine.cpu_model(tmp_path / "missing"), str)


def test_describe_machine_has_every_key():
    described = machine.describe_machine(repeats=1)
    assert set(described) == {"cores", "cpu", "python", "reference_statement", "reference_loop_ms"}
    assert described["reference_statement"] == machine.REFERENCE_STATEMENT
