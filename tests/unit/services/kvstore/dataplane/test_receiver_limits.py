"""The receiver's limits, over a real socket pair into a real store: a
staging buffer is lent per chunk (an idle connection holds none), and a
connection silent past its socket timeout (listener.set_io_timeout) is
ended with the reservations it wrote to aborted, before their lease."""
from __future__ import annotations

import socket
import threading

import numpy as np

from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.dataplane import wire
from speckv.services.kvstore.dataplane.listener import set_io_timeout
from speckv.services.kvstore.dataplane.receiver import StagingBuffers, serve_connection
from tests.support.kvstore_service import TINY, block_bytes, make_store
from tests.support.waiting import TIMEOUT, wait_until

BPB = TINY.bytes_per_block
IDLE_S = 0.2  # the socket timeout under test; the lease below is far longer


class CountingBuffers(StagingBuffers):
    """StagingBuffers that count what they made and what is lent now."""

    def __init__(self) -> None:
        super().__init__()
        self.made = 0
        self.lent = 0

    def get(self) -> np.ndarray:
        self.lent += 1
        before = len(self._free)
        buffer = super().get()
        self.made += before == len(self._free)  # nothing was free: a new one
        return buffer

    def put(self, buffer: np.ndarray) -> None:
        self.lent -= 1
        super().put(buffer)


class StagedSink:
    """The store as a device pool presents it: no zero-copy views, so chunks
    go through a staging buffer and write_chunk."""

    def __init__(self, store) -> None:
        self.store = store

    def begin_write(self, handle, offset, size):
        self.store.check_write(handle, offset, size)
        return None

    def __getattr__(self, name):
        return getattr(self.store, name)


def start(sink, staging, timeout_s: float | None = None) -> tuple[socket.socket, threading.Thread]:
    source, target = socket.socketpair()
    if timeout_s is not None:
        set_io_timeout(target, timeout_s)

    def run() -> None:
        try:
            serve_connection(target, sink, staging, "test")
        finally:
            target.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    source.settimeout(TIMEOUT)
    return source, thread


def header(kind: wire.Kind, handle: str, offset: int = 0, length: int = 0, crc: int = 0) -> bytes:
    return bytes(wire.encode_header(wire.header_buffer(), kind, handle.encode(), offset, length, crc))


def test_a_staging_buffer_is_lent_for_one_chunk_and_none_while_idle():
    store = make_store(8)
    grant = store.reserve("o1", [1, 2], 30.0, family="f")
    data = block_bytes(1) + block_bytes(2)
    buffers = CountingBuffers()
    source, thread = start(StagedSink(store), buffers)
    source.sendall(header(wire.Kind.CHUNK, grant.handle, 0, BPB, crc32c(data[:BPB])))
    source.sendall(data[:BPB // 2])
    assert wait_until(lambda: buffers.lent == 1)  # mid-chunk: one buffer
    source.sendall(data[BPB // 2:BPB])
    source.sendall(header(wire.Kind.CHUNK, grant.handle, BPB, BPB, crc32c(data[BPB:])) + data[BPB:])
    source.sendall(header(wire.Kind.END, grant.handle))
    assert wire.read_reply(source).bytes_received == 2 * BPB
    assert (buffers.lent, buffers.made) == (0, 1)  # between chunks: none lent; the one made was reused
    source.close()
    thread.join(TIMEOUT)
    assert not thread.is_alive()


def test_a_connection_silent_mid_chunk_is_ended_and_its_reservation_aborted():
    store = make_store(8)
    grant = store.reserve("o1", [1, 2], 3600.0, family="f")
    data = block_bytes(1) + block_bytes(2)
    source, thread = start(store, StagingBuffers(), timeout_s=IDLE_S)
    source.sendall(header(wire.Kind.CHUNK, grant.handle, 0, len(data), crc32c(data)))
    source.sendall(data[:BPB // 2])  # then nothing
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert source.recv(1) == b""  # closed, not left hanging
    assert store.stats().reserved_pages == 0 and store.stats().free_pages == 8  # pages back before the lease


def test_a_connection_silent_between_frames_is_ended():
    store = make_store(8)
    grant = store.reserve("o1", [1], 3600.0, family="f")
    source, thread = start(store, StagingBuffers(), timeout_s=IDLE_S)
    source.sendall(header(wire.Kind.CHUNK, grant.handle, 0, BPB, crc32c(block_bytes(1))) + block_bytes(1))
    thread.join(TIMEOUT)  # no END: the written reservation is aborted, not left to its lease
    assert not thread.is_alive()
    assert store.stats().reserved_pages == 0
