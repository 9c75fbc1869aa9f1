"""The disk tier's reads, timed for `speckv bench transfer --transports
disk` beside the raw ceiling of the same filesystem in the same run.

disk: a preallocated record file (services/kvstore/disk/medium.py) under
--disk-dir holding `volume` bytes of block records of the geometry, written
once through the tier's own record writer; then every record read back by
the tier's RecordReader (the path a disk hit takes: requests of
request_bytes, `depth` threads of os.preadv, each record's header and
crc32c checked), in batches of BATCH records into aligned buffers made
(and faulted in) once, as the reader's own recycled buffers are.
raw: a plain file of the same size on the same filesystem, opened O_DIRECT
(buffered where refused, as the tier would), read whole by the same number
of threads issuing preadv requests of the same size into aligned buffers,
nothing checked. The two alternate, best of `repeats` each (medians kept).
GB/s = 1e9 B/s. Target (docs/disk.md): disk / raw >= 0.8.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

from speckv.services.common.geometry import KVGeometry
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import FileMedium, open_direct
from speckv.services.kvstore.disk.reader import Outcome, RecordReader
from speckv.services.kvstore.disk.tier import DiskTier, PendingBlock

BATCH = 64  # records per reader call (the buffers reused across calls)


def disk_reads(geometry: KVGeometry, volume: int, request_bytes: int, depth: int, repeats: int,
               directory: Path | None = None) -> dict[str, Any]:
    """The disk row: disk_read_gbps, raw_read_gbps (best of repeats) and the settings behind them."""
    size = records.record_bytes(geometry.bytes_per_block)
    slots = max(1, volume // size)
    with tempfile.TemporaryDirectory(prefix="speckv-disk-bench-", dir=directory) as where:
        tier = _written_tier(Path(where), geometry, slots, request_bytes, depth)
        raw_path = Path(where) / "raw.dat"
        _fill(raw_path, slots * size)
        raw_fd, raw_direct = open_direct(raw_path)
        buffers = [records.aligned_buffer(size) for _ in range(min(BATCH, slots))]  # faulted in by the warm-up
        try:
            disk_runs, raw_runs = [], []
            for _ in range(repeats + 1):  # the first pair warms up, untimed
                disk_runs.append(_timed(slots * size, lambda: _read_tier(tier, slots, buffers)))
                raw_runs.append(_timed(slots * size, lambda: _read_raw(raw_fd, slots * size, request_bytes, depth)))
        finally:
            os.close(raw_fd)
            tier.close()
        fs = _filesystem(Path(where))
    disk_runs, raw_runs = disk_runs[1:], raw_runs[1:]
    return {"bytes": slots * size, "records": slots, "record_bytes": size, "request_bytes": request_bytes,
            "depth": depth, "direct": tier.medium.direct and raw_direct, "filesystem": fs,
            "directory": str(directory or tempfile.gettempdir()),
            "disk_read_gbps": max(disk_runs), "raw_read_gbps": max(raw_runs),
            "disk_read_median_gbps": statistics.median(disk_runs), "raw_read_median_gbps": statistics.median(raw_runs),
            "disk_read_over_raw": max(disk_runs) / max(raw_runs)}


def _written_tier(where: Path, geometry: KVGeometry, slots: int, request_bytes: int, depth: int) -> DiskTier:
    bpb = geometry.bytes_per_block
    medium = FileMedium(where, slots, records.record_bytes(bpb))
    digest = records.layout_digest(geometry)
    tier = DiskTier(medium, RecordReader(medium, digest, bpb, request_bytes=request_bytes, depth=depth), digest, bpb)
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, bpb, dtype=np.uint8)
    for start in range(0, slots, BATCH):
        batch = []
        for slot in range(start, min(slots, start + BATCH)):
            block = PendingBlock(slot + 1, tier.buffer())
            records.payload_of(block.record, bpb)[:] = payload
            batch.append((slot, block))
        tier.write_records(batch, [slot + 1 for slot, _ in batch])
        for _, block in batch:
            tier.give_back(block.record)
    return tier


def _read_tier(tier: DiskTier, slots: int, buffers: list[np.ndarray]) -> None:
    for start in range(0, slots, BATCH):
        count = min(BATCH, slots - start)
        reads = tier.reader.read(range(start, start + count), buffers[:count])
        if any(r.outcome is not Outcome.OK for r in reads):
            raise RuntimeError("disk bench: a record failed its check")


def _read_raw(fd: int, nbytes: int, request_bytes: int, depth: int) -> None:
    buffers = [records.aligned_buffer(request_bytes) for _ in range(depth)]  # the same per call

    def lane(lane_index: int) -> None:
        buffer = buffers[lane_index]
        for offset in range(lane_index * request_bytes, nbytes, depth * request_bytes):
            n = min(request_bytes, nbytes - offset)
            os.preadv(fd, [buffer[:n]], offset)

    with ThreadPoolExecutor(depth) as pool:
        list(pool.map(lane, range(depth)))


def _fill(path: Path, nbytes: int) -> None:
    """A plain file of nbytes of data (written, not sparse: reads hit the drive)."""
    chunk = np.random.default_rng(1).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        for at in range(0, nbytes, len(chunk)):
            f.write(chunk[:min(len(chunk), nbytes - at)])
        f.flush()
        os.fsync(f.fileno())


def _timed(nbytes: int, run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return nbytes / (time.perf_counter() - start) / 1e9


def _filesystem(path: Path) -> str:
    """The filesystem type path lies on (/proc/mounts, longest mount prefix)."""
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            mount = fields[1]
            if str(path).startswith(mount.rstrip("/") + "/") or str(path) == mount:
                if len(mount) > len(best):
                    best, kind = mount, fields[2]
    except OSError:
        pass
    return f"{kind} at {best}" if best else kind
