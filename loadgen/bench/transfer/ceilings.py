"""Ceilings and component rates for the transfer benchmark, measured in the
same run as the replication numbers. Every rate is GB/s (1e9 bytes/s), the
best of `repeats` timed passes after one untimed warm-up pass over reused,
already-touched buffers.

- memcpy: np.copyto between two reused buffers.
- socket: Python loopback TCP, sendall of a reused 1 MiB buffer in this
  process, recv_into a reused 1 MiB buffer in a spawned process (spawn, not
  fork: the parent holds large buffers, DESIGN.md); once with default socket
  options and once with the data plane's (data_plane.tune: TCP_NODELAY and
  8 MiB kernel buffers, which alone can lift loopback by half). The ceiling
  is the better of the two, so tuning the data plane cannot flatter it.
- pack / unpack: the NumPy reference kernels (kernels/reference.py) between a
  layer-major pool and a staging buffer, for a real geometry.
- crc32c: the crc32c package over a reused buffer (what each chunk costs twice).
- gmac: the chunk MAC of data_plane_auth (AES-GMAC), fed 32 KiB pieces.
- socket + crc32c: the tuned socket whose receiver also checksums every
  chunk it received, in the same process and thread: what any receiver that
  checks every byte can reach here, before any bookkeeping of its own.
"""
from __future__ import annotations

import multiprocessing as mp
import socket
import time
from typing import Callable

import numpy as np

from speckv.kernels import reference
from speckv.services.common.geometry import KVGeometry
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.dataplane.listener import tune

MIB = 1 << 20


def best_rate(nbytes: int, run: Callable[[], None], repeats: int) -> float:
    run()  # warm-up: page faults, caches
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return nbytes / best / 1e9


def memcpy_gbps(nbytes: int, repeats: int) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.ones(nbytes, dtype=np.uint8)
    return best_rate(nbytes, lambda: np.copyto(dst, src), repeats)


def crc32c_gbps(nbytes: int, repeats: int) -> float:
    data = np.ones(nbytes, dtype=np.uint8)
    return best_rate(nbytes, lambda: crc32c(data), repeats)


def pack_unpack_gbps(geometry: KVGeometry, blocks: int, repeats: int) -> tuple[float, float]:
    g = geometry
    pool = np.ones((g.num_layers, 2, blocks * 2, g.block_size, g.num_kv_heads, g.head_dim), dtype=g.storage_dtype)
    staging = np.ones(blocks * g.bytes_per_block // g.itemsize, dtype=g.storage_dtype)
    pages = list(range(0, blocks * 2, 2))  # every other page: a scattered, realistic list
    nbytes = blocks * g.bytes_per_block
    pack = best_rate(nbytes, lambda: reference.pack(pool, pages, staging), repeats)
    unpack = best_rate(nbytes, lambda: reference.unpack(staging, pool, pages), repeats)
    return pack, unpack


def gmac_gbps(nbytes: int, repeats: int, piece: int = 32 * 1024) -> float:
    """The data plane's chunk MAC (AES-GMAC, dataplane/possession.py) over
    nbytes fed in piece-sized updates, as the receiver feeds it segments."""
    from speckv.services.kvstore.dataplane.possession import ChunkMac

    view = memoryview(np.ones(nbytes, dtype=np.uint8))

    def run() -> None:
        mac = ChunkMac(bytes(32), "bench", 0, nbytes, 0)
        for lo in range(0, nbytes, piece):
            mac.update(view[lo:lo + piece])
        mac.tag()
    return best_rate(nbytes, run, repeats)


def _receiver(port_queue: "mp.Queue[int]", chunk: int, tuned: bool, checksum: bool = False) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port_queue.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    if tuned:
        tune(conn)
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    header = bytearray(8)
    while True:
        if conn.recv_into(header, 8, socket.MSG_WAITALL) < 8:
            return
        remaining = int.from_bytes(header, "little")
        while remaining:
            want = min(chunk, remaining)
            n = conn.recv_into(view, want, socket.MSG_WAITALL if checksum else 0)
            if n == 0:
                return
            if checksum:
                crc32c(view[:n])
            remaining -= n
        conn.sendall(b"k")


class SocketCeiling:
    """A raw socket link to a spawned receiver, kept open so the ceiling can
    be re-measured between replication runs (the machine is shared: load
    drifts within a run). Each pass: announce nbytes, sendall them in
    chunk-sized pieces of one reused buffer, wait for the one-byte ack.
    tuned: both ends get the data plane's socket options."""

    def __init__(self, nbytes: int, chunk: int = MIB, tuned: bool = False, checksum: bool = False) -> None:
        context = mp.get_context("spawn")
        ports: mp.Queue[int] = context.Queue()
        self._child = context.Process(target=_receiver, args=(ports, chunk, tuned, checksum), daemon=True)
        self._child.start()
        try:
            self._sock = socket.create_connection(("127.0.0.1", ports.get(timeout=60)))
        except BaseException:
            self._child.kill()
            raise
        if tuned:
            tune(self._sock)
        self._payload = memoryview(np.ones(chunk, dtype=np.uint8))
        self._chunk = chunk
        self.total = nbytes // chunk * chunk

    def _one_pass(self) -> None:
        self._sock.sendall(self.total.to_bytes(8, "little"))
        for _ in range(self.total // self._chunk):
            self._sock.sendall(self._payload)
        self._sock.recv_into(bytearray(1), 1, socket.MSG_WAITALL)

    def gbps(self, repeats: int) -> float:
        return best_rate(self.total, self._one_pass, repeats)

    def close(self) -> None:
        self._sock.close()
        self._child.join(timeout=10)
        if self._child.is_alive():
            self._child.kill()


def socket_gbps(nbytes: int, repeats: int, chunk: int = MIB, tuned: bool = False, checksum: bool = False) -> float:
    """One SocketCeiling measurement: best of repeats passes. checksum: the
    receiver also takes the crc32c of each chunk it received (what the data
    plane must do to every byte), right after it lands."""
    link = SocketCeiling(nbytes, chunk, tuned, checksum)
    try:
        return link.gbps(repeats)
    finally:
        link.close()
