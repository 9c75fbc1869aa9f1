"""Free ports for the local cluster's children (pure socket calls, no service)."""
from __future__ import annotations

import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """count distinct ports nothing listens on now (bound together, so none repeats; the OS's picks for
    sockets bound to port 0); another process may take one before its server binds, which that server's
    start then reports."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
