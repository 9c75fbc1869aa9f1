"""The disk flags: each bad one is refused with an error naming it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.disk import records

RECORD = records.record_bytes(512)  # the tiny geometry's


def config(**overrides) -> KVStoreConfig:
    return KVStoreConfig(**{"host_pages": 8, **overrides})


def refused(match: str, **overrides) -> None:
    with pytest.raises(InvalidArgument, match=match):
        config(**overrides).validate()


def test_good_disk_flags_pass(tmp_path: Path):
    config(disk_dir=str(tmp_path), disk_bytes=4 * RECORD).validate()
    config().validate()


def test_bad_disk_flags_name_the_flag(tmp_path: Path):
    refused("--disk-dir=.*needs --disk-bytes", disk_dir=str(tmp_path))
    refused("--disk-bytes=.*needs --disk-dir", disk_bytes=RECORD)
    refused("--disk-bytes=-1", disk_dir=str(tmp_path), disk_bytes=-1)
    refused(f"--disk-bytes=1000: not a multiple of one block record \\({RECORD} bytes", disk_dir=str(tmp_path),
            disk_bytes=1000)
    refused("--disk-dir=.*does not exist", disk_dir=str(tmp_path / "nope"), disk_bytes=RECORD)
    afile = tmp_path / "file"
    afile.write_text("x")
    refused("--disk-dir=.*is not a directory", disk_dir=str(afile), disk_bytes=RECORD)
    refused("needs a host tier", disk_dir=str(tmp_path), disk_bytes=RECORD, host_pages=0)
    refused("--disk-request-kib=3", disk_dir=str(tmp_path), disk_bytes=RECORD, disk_request_kib=3)
    refused("--disk-depth=0", disk_dir=str(tmp_path), disk_bytes=RECORD, disk_depth=0)
    refused("--disk-bytes=.*has only", disk_dir=str(tmp_path), disk_bytes=RECORD * (1 << 40))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_directory_is_refused(tmp_path: Path):
    tmp_path.chmod(0o500)
    try:
        refused("--disk-dir=.*not writable", disk_dir=str(tmp_path), disk_bytes=RECORD)
    finally:
        tmp_path.chmod(0o700)
