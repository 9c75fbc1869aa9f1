"""The machine entry of speckv simulate's JSON: a speed reference that
scales with the work it times, and the CPU model read from cpuinfo."""
from __future__ import annotations

import subprocess
import sys

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
    assert set(described) == {"cores", "memory_mb", "cpu", "python", "reference_statement", "reference_loop_ms"}
    assert described["reference_statement"] == machine.REFERENCE_STATEMENT


def test_peak_rss_grows_when_the_process_touches_more_memory():
    # A fresh process: this one's peak may already be above anything a test allocates.
    script = ("from speckv.loadgen.sim.machine import peak_rss_mb\n"
              "before = peak_rss_mb()\n"
              "block = bytearray(256 << 20)\n"  # zero-filled, so every page is touched: resident
              "print(before, peak_rss_mb())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    before, after = map(float, out.stdout.split())
    assert before > 0 and after >= before + 128  # the start-up peak can sit above the resident size


def test_peak_rss_reads_vmhwm_and_falls_back_to_getrusage(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t  900000 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n")
    assert machine.peak_rss_mb(status) == 200.0
    assert machine.peak_rss_mb(tmp_path / "missing") > 0


def test_memory_is_the_machines_physical_memory_in_mib():
    memory = machine.memory_mb()
    assert memory is None or memory > machine.peak_rss_mb()
