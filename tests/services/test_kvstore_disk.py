"""A kvstore process with a disk tier (--disk-dir): host evictions reach
the disk, a restart on the same directory re-indexes it and announces its
blocks (STORAGE) to a subscriber starting from 0, and a kill -9 while the
writer runs leaves no partial block visible after the restart."""
from __future__ import annotations

import threading
from pathlib import Path

import grpc

from speckv.services.kvstore.disk import records
from speckv.v1 import kvstore_pb2
from tests.support.kvstore_procs import GEOMETRY, GEOMETRY_ARGS, TIMEOUT, block, blocks_of, present, put, stats
from tests.support.kvstore_procs import start_kvstore
from tests.support.waiting import wait_until

RECORD = records.record_bytes(GEOMETRY.bytes_per_block)


def disk_args(directory: Path, slots: int) -> list[str]:
    return [*GEOMETRY_ARGS, "--device-pages", "2", "--host-pages", "2", "--disk-dir", str(directory),
            "--disk-bytes", str(slots * RECORD)]


def first_event(process) -> kvstore_pb2.KVEvent:
    stream = process.stub.SubscribeEvents(kvstore_pb2.SubscribeEventsRequest(after_sequence=0), timeout=TIMEOUT)
    try:
        return next(iter(stream))
    finally:
        stream.cancel()


def test_a_restart_on_the_same_directory_reindexes_and_announces_the_disk(tmp_path: Path):
    node = start_kvstore("disk-a", disk_args(tmp_path, 8))
    try:
        for pair in ([1, 2], [3, 4], [5, 6]):
            put(node, pair)
        # the writer counts a write just after its pages show as used: wait for both
        assert wait_until(lambda: stats(node).disk_used_pages == 2 and stats(node).disk_counters["written"] == 2,
                          timeout=TIMEOUT)
        assert stats(node).blocks_dropped_total == 0
    finally:
        node.stop()
    again = start_kvstore("disk-a", disk_args(tmp_path, 8))
    try:
        snapshot = first_event(again)
        assert snapshot.type == kvstore_pb2.KV_EVENT_TYPE_SNAPSHOT and set(snapshot.disk_block_hashes) == {1, 2}
        assert present(again, [1, 2, 3]) == [True, True, False]
        assert blocks_of(again, [1, 2]) == [block(1), block(2)]  # staged up from the disk, checked
        s = stats(again)
        assert s.disk_counters["reindexed"] == 2 and s.disk_counters["read"] == 2 and s.host_used_pages == 2
    finally:
        again.stop()


def test_a_kill_9_while_the_writer_runs_leaves_no_partial_block(tmp_path: Path):
    node = start_kvstore("disk-k", disk_args(tmp_path, 64))
    stop = threading.Event()

    def load() -> None:  # keeps the host tier evicting, so the writer is busy when the kill lands
        h = 100
        while not stop.is_set():
            try:
                put(node, [h, h + 1])
            except grpc.RpcError:
                return
            h += 2

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        assert wait_until(lambda: stats(node).disk_counters["written"] >= 40, timeout=TIMEOUT)
        node.kill()
    finally:
        stop.set()
        loader.join(timeout=TIMEOUT)
        node.stop()
    again = start_kvstore("disk-k", disk_args(tmp_path, 64))
    try:
        held = list(first_event(again).disk_block_hashes)
        assert len(held) >= 30  # what was written before the kill is back
        assert all(present(again, held))
        for h in held:  # every block it announces is whole: its own bytes, never a torn record
            assert blocks_of(again, [h]) == [block(h)]
        assert stats(again).disk_counters["reindexed"] == len(held)
    finally:
        again.stop()
