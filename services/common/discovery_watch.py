"""Re-resolving a target list's `dns:` names on a thread (adapter of
discovery.py's Membership).

- every `interval_s` (default 5 s; the first round at once when started) it
  resolves each name with `resolve` (default: the system resolver through
  socket.getaddrinfo), feeds the Membership, and calls `on_change` with what
  joined and what left, on its own thread, one call at a time;
- `resolve_dns` keeps one address family: IPv4 if the name has any IPv4
  address, else IPv6. A dual-stack pod has an address of each family for
  the same process, which would be two links to one replica;
- a resolution that fails (OSError: no such name yet, resolver down) is
  logged once per name until it succeeds again and changes nothing;
- `own_addresses` finds what this process's own address resolves to, so a
  replica can leave itself out of its peers (a headless Service lists it too).
"""
from __future__ import annotations

import logging
import socket
import threading
from typing import Callable, Iterable

from speckv.services.common.clock import Clock, SystemClock
from speckv.services.common.discovery import Changes, DnsName, Membership, Targets, join_host_port, split_host_port

log = logging.getLogger(__name__)

Resolve = Callable[[str, int], list[str]]  # (name, port) -> ["host:port", ...]; OSError when it cannot
INTERVAL_S = 5.0
GRACE_S = 15.0  # three rounds: a pod's address is closed 15-20 s after DNS stops naming it
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def resolve_dns(name: str, port: int) -> list[str]:
    """name's addresses at port, one family (module docstring), sorted."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    v4 = {info[4][0] for info in infos if info[0] == socket.AF_INET}
    v6 = {info[4][0].split("%", 1)[0] for info in infos if info[0] == socket.AF_INET6}
    return sorted(join_host_port(host, port) for host in (v4 or v6))


def own_addresses(addresses: Iterable[str], resolve: Resolve = resolve_dns) -> frozenset[str]:
    """Every host:port this process may appear as among resolved addresses:
    each given address itself, and what its host resolves to at its port; a
    wildcard host (0.0.0.0, ::) stands for this machine's hostname (a pod's or
    a container's resolves to its own IP through /etc/hosts)."""
    own: set[str] = set()
    for address in addresses:
        own.add(address)
        host, port = split_host_port(address)
        name = socket.gethostname() if host in WILDCARD_HOSTS else host
        try:
            own.update(resolve(name, port))
        except OSError as exc:
            log.warning("cannot resolve this process's own address %s (%s): it may share routes with itself", name, exc)
    return frozenset(own)


class TargetWatcher:
    """The module docstring's thread. members() may be read from any thread."""

    def __init__(self, targets: Targets, on_change: Callable[[Changes], None], *, name: str,
                 interval_s: float = INTERVAL_S, grace_s: float = GRACE_S, resolve: Resolve = resolve_dns,
                 clock: Clock | None = None, exclude: Iterable[str] = ()) -> None:
        self._targets = targets
        self._membership = Membership(targets, clock or SystemClock(), grace_s, exclude)
        self._members = self._membership.members()
        self._on_change, self._resolve, self._interval_s = on_change, resolve, interval_s
        self._stop = threading.Event()
        self._failing: set[DnsName] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def members(self) -> tuple[str, ...]:
        return self._members

    def initial(self) -> tuple[str, ...]:
        """The members before any resolution: the static addresses."""
        return self._membership.members()

    def start(self) -> "TargetWatcher":
        if self._targets.names:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Returns once no on_change call runs or will run."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def refresh(self) -> Changes:
        """One round: resolves every name, applies and returns the changes
        (and calls on_change with them if any)."""
        added: list[str] = []
        removed: list[str] = []
        for name in self._targets.names:
            try:
                addresses = self._resolve(name.name, name.port)
            except OSError as exc:
                if name not in self._failing:
                    log.warning("cannot resolve %s: %s (keeping its %d known addresses)", name, exc,
                                len(self._members))
                    self._failing.add(name)
                continue
            self._failing.discard(name)
            changes = self._membership.resolved(name, addresses)
            added += changes.added
            removed += changes.removed
        self._members = self._membership.members()
        changes = Changes(tuple(a for a in added if a not in removed), tuple(a for a in removed if a not in added))
        if changes:
            log.info("%s: joined %s, left %s", ", ".join(map(str, self._targets.names)),
                     list(changes.added), list(changes.removed))
            self._on_change(changes)
        return changes

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a bug in a callback must not end discovery for good
                log.exception("address discovery round failed")
            self._stop.wait(self._interval_s)
