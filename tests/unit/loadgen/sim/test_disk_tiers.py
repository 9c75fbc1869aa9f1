"""`speckv simulate --disk-blocks 0,N` runs every policy with and without
the disk tier on the same requests and prints the disk-tier table: each
returning p99 and reuse recovered with its 95 % interval, and the ratios of
the returning p99 (against the same policy without the disk, against `none`
with the same disk) with their paired intervals, which hold the ratios."""
from __future__ import annotations

import json

import pytest

from speckv.loadgen.sim import cli
from speckv.services.common.errors import InvalidArgument


def test_two_disk_sizes_give_the_disk_tier_table_with_paired_intervals(tmp_path, capsys):
    out = tmp_path / "sim.json"
    code = cli.main(["--synthetic", "document-bursts", "--nodes", "4", "--start-s", "600", "--duration-s", "20",
                     "--policies", "none,oracle", "--host-pages", "64", "--disk-blocks", "0,4000", "--jobs", "1",
                     "--compiled", "off", "--json", str(out)], {})
    assert code == 0
    data = json.loads(out.read_text())
    rows = {(r["policy"], r["disk_blocks"]): r for r in data["disk_tiers"]}
    assert set(rows) == {("none", 0), ("none", 4000), ("oracle", 0), ("oracle", 4000)}
    for (policy, disk), r in rows.items():
        if r["returning_p99_ms"] is not None:
            low, high = r["returning_p99_ci95"]
            assert low <= r["returning_p99_ms"] <= high
        low, high = r["reuse_recovered_ci95"]
        assert low <= r["reuse_recovered"] <= high
        assert (r["vs_first_disk"] is None) == (disk == 0)
        assert (r["vs_none"] is None) == (policy == "none")
        for ratio in ("vs_first_disk", "vs_none"):
            if r[ratio] is not None:
                low, high = r[f"{ratio}_ci95"]
                assert low <= r[ratio] <= high, (policy, disk, ratio)
    assert rows[("oracle", 4000)]["vs_first_disk"] == pytest.approx(
        rows[("oracle", 4000)]["returning_p99_ms"] / rows[("oracle", 0)]["returning_p99_ms"])
    # the other tables are the first size's: no disk tier
    assert data["policies"]["none"]["returning_ttft_p99_ms"] == rows[("none", 0)]["returning_p99_ms"]
    printed = capsys.readouterr().out
    assert "the disk tier (disk_tiers.py" in printed and "| 4 | oracle | 4,000 |" in printed


@pytest.mark.parametrize("sizes", ["0,0", "-1,5", "a,b"])
def test_bad_disk_size_lists_are_refused(sizes):
    with pytest.raises(InvalidArgument, match="--disk-blocks"):
        cli.parse_args(["--synthetic", "document-bursts", f"--disk-blocks={sizes}"])


def test_disk_size_lists_do_not_combine_with_seeds():
    with pytest.raises(InvalidArgument, match="do not combine"):
        cli.parse_args(["--synthetic", "document-bursts", "--disk-blocks", "0,100", "--seeds", "7,11"])
