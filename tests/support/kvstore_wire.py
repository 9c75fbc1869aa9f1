"""Helpers of the data plane tests: a real receiver on one end of a socket
pair, serving a real KVStoreCore, and a raw frame writer for the other end."""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

import numpy as np

from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.dataplane import wire
from speckv.services.kvstore.dataplane.receiver import serve_connection
from speckv.services.kvstore.store import KVStoreCore

JOIN_S = 10.0  # generous: a loaded 2-core machine


@dataclass
class Link:
    """The source end of a connection served by serve_connection on a thread."""

    sock: socket.socket
    thread: threading.Thread

    def chunk(self, handle: str, offset: int, data: bytes, crc: int | None = None) -> None:
        header = wire.header_buffer()
        self.sock.sendall(wire.encode_header(header, wire.Kind.CHUNK, handle.encode(), offset, len(data),
                                             crc32c(data) if crc is None else crc))
        self.sock.sendall(data)

    def end(self, handle: str) -> wire.Reply:
        self.sock.sendall(wire.encode_header(wire.header_buffer(), wire.Kind.END, handle.encode(), 0, 0, 0))
        return wire.read_reply(self.sock)

    def reply(self) -> wire.Reply:
        return wire.read_reply(self.sock)

    def close(self) -> None:
        """Closes the source end and waits for the receiver to finish."""
        self.sock.close()
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive(), "receiver did not finish"


def serve(store: KVStoreCore) -> Link:
    source, target = socket.socketpair()

    def run() -> None:
        try:
            serve_connection(target, store, np.ones(wire.MAX_CHUNK_BYTES, dtype=np.uint8), "test")
        finally:
            target.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    source.settimeout(JOIN_S)
    return Link(source, thread)
