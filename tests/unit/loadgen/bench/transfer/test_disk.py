"""The disk row of `speckv bench transfer`: both reads cover the same bytes
with the same request size and depth, and the ratio is theirs."""
from __future__ import annotations

from pathlib import Path

from speckv.loadgen.bench.transfer.disk import disk_reads
from speckv.services.common.geometry import preset
from speckv.services.kvstore.disk import records


def test_the_disk_row_reads_every_record_and_its_raw_twin(tmp_path: Path):
    geometry = preset("tiny", 2048)  # 64 KiB blocks
    row = disk_reads(geometry, 16 * records.record_bytes(geometry.bytes_per_block), 16384, 2, 1, tmp_path)
    assert row["records"] == 16 and row["bytes"] == 16 * row["record_bytes"]
    assert (row["request_bytes"], row["depth"]) == (16384, 2) and row["filesystem"] != "unknown"
    assert row["disk_read_gbps"] > 0 and row["raw_read_gbps"] > 0
    assert row["disk_read_over_raw"] == row["disk_read_gbps"] / row["raw_read_gbps"]
    assert list(tmp_path.iterdir()) == []  # its files are gone
