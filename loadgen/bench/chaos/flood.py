"""A pre-authentication flood of a kvstore's data port (issue 43, item 1):
`connections` TCP connections that never send a byte, spread over several
loopback source addresses (127.0.1.1, 127.0.1.2, ...: Linux routes all of
127/8 to lo), each closed and opened again every `reopen_s` or as soon as
the node closes it, whichever comes first; so the port sees connections
opened and re-opened faster than any read timeout for as long as it runs.

eager (the default): a connection the node closes is opened again at
once, so the flood is as fast as this client can connect (a connect flood);
not eager: at its next `reopen_s` tick, so each of the `connections` is
opened at most once per `reopen_s` (connections / reopen_s per second).

One thread and a selector drive every socket (non-blocking connects); a
client-side close is a reset (SO_LINGER 0), as a flooder's would be, so
the flood leaves no TIME_WAIT behind to run out of ports. Counts what
happened: connections opened, closed by the node (an EOF or a reset,
with or without a reply), and connects that failed.
"""
from __future__ import annotations

import errno
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import cast

LINGER_RESET = struct.pack("ii", 1, 0)


@dataclass(slots=True)
class FloodCounts:
    opened: int = 0
    closed_by_node: int = 0
    connect_failed: int = 0


def loopback_sources(count: int) -> list[str]:
    """count loopback addresses, 127.0.1.1, 127.0.1.2, ... (never 127.0.0.1,
    which the rightful senders on this machine use)."""
    return [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(count)]


class Flood:
    """Keeps `connections` idle connections to address open from sources
    (round robin), re-opening each after reopen_s seconds or when the node
    closes it. start() / stop(); counts while it runs."""

    def __init__(self, address: tuple[str, int], connections: int, sources: list[str], reopen_s: float,
                 eager: bool = True) -> None:
        if connections < 1 or not sources or not reopen_s > 0:
            raise ValueError("a flood needs connections >= 1, a source address and reopen_s > 0")
        self.address = address
        self.connections = connections
        self.sources = sources
        self.reopen_s = reopen_s
        self.eager = eager
        self.counts = FloodCounts()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="data-port-flood", daemon=True)

    def start(self) -> "Flood":
        self._thread.start()
        return self

    def stop(self) -> FloodCounts:
        self._stopping.set()
        self._thread.join(timeout=10.0)
        return self.counts

    def __enter__(self) -> "Flood":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        opened_at: dict[socket.socket, float] = {}
        waiting: list[tuple[float, str]] = []  # not eager: (when, source) of connections the node closed
        try:
            for i in range(self.connections):
                self._open(selector, opened_at, self.sources[i % len(self.sources)])
            while not self._stopping.is_set():
                for key, _ in selector.select(0.02):
                    sock = cast(socket.socket, key.fileobj)
                    if self._node_closed(sock):
                        self.counts.closed_by_node += 1
                        if self.eager:
                            self._reopen(selector, opened_at, sock, key.data)
                        else:
                            waiting.append((opened_at[sock] + self.reopen_s, key.data))
                            self._close(selector, opened_at, sock)
                now = time.monotonic()
                for sock, since in list(opened_at.items()):
                    if now - since >= self.reopen_s:
                        self._reopen(selector, opened_at, sock, selector.get_key(sock).data)
                due = [source for when, source in waiting if when <= now]
                waiting = [(when, source) for when, source in waiting if when > now]
                for source in due:
                    self._open(selector, opened_at, source)
        finally:
            for sock in list(opened_at):
                self._close(selector, opened_at, sock)
            selector.close()

    def _open(self, selector: selectors.BaseSelector, opened_at: dict[socket.socket, float], source: str) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        sock.setblocking(False)
        try:
            sock.bind((source, 0))
            code = sock.connect_ex(self.address)
        except OSError as exc:
            code = exc.errno or errno.EIO
        if code not in (0, errno.EINPROGRESS):
            self.counts.connect_failed += 1
            sock.close()
            self._stopping.wait(0.01)  # a refused or failed connect: do not spin
            return
        self.counts.opened += 1
        opened_at[sock] = time.monotonic()
        selector.register(sock, selectors.EVENT_READ, source)

    def _reopen(self, selector: selectors.BaseSelector, opened_at: dict[socket.socket, float],
                sock: socket.socket, source: str) -> None:
        self._close(selector, opened_at, sock)
        if not self._stopping.is_set():
            self._open(selector, opened_at, source)

    @staticmethod
    def _close(selector: selectors.BaseSelector, opened_at: dict[socket.socket, float], sock: socket.socket) -> None:
        opened_at.pop(sock, None)
        selector.unregister(sock)
        sock.close()

    @staticmethod
    def _node_closed(sock: socket.socket) -> bool:
        """Readable: the node's reply and close, or a reset (a flood socket
        never sends, so anything readable is the node ending it)."""
        try:
            while sock.recv(4096):
                pass
        except BlockingIOError:
            return False  # a reply came, the close not yet: wait for it
        except OSError:
            pass
        return True
