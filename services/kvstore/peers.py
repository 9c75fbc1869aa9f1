"""Where this node may send replicas: only to registered nodes, at the
address each registered with the scheduler (docs/security.md). Replicate
and the scheduler's orders name a target address; with data_plane_auth on,
the Replicator asks check() before it opens any connection, so a request
naming some other host:port connects nowhere.

The registry is the scheduler's (GetClusterState, over the agent's channel:
mutual TLS when TLS is on), cached here. A miss refreshes it, at most once
per `min_refresh_s` (seconds), so a node that registered a moment ago is
found and a flood of bad targets costs the scheduler one call a second. A
miss during a refresh waits for that refresh and checks its result: orders
to two peers sent together must not see one of them refused because the
other's fetch had started and not yet landed.
A node without a scheduler has no registry and refuses every target.

The data address a target's Reserve answers (its TCP data plane) must be on
the host of its registered address (`check_data_address`): a target cannot
point the source's bytes at a third machine.

Thread-safe: one lock around the cache, and one that a fetch holds while it
runs (a check waits on it only when its target was not in the cache).
"""
from __future__ import annotations

import threading
from typing import Callable, Mapping

from speckv.services.common.clock import Clock
from speckv.services.common.errors import PermissionDenied

RegistryFetch = Callable[[], Mapping[str, str]]  # node id -> registered address; raises Unavailable


class RegisteredPeers:
    def __init__(self, fetch: RegistryFetch | None, clock: Clock, min_refresh_s: float = 1.0) -> None:
        self._fetch = fetch
        self._clock = clock
        self._min_refresh_s = min_refresh_s
        self._nodes: dict[str, str] = {}
        self._fetched_at: float | None = None
        self._lock = threading.Lock()
        self._fetching = threading.Lock()  # held for the whole of a fetch

    def check(self, target_node: str, target_address: str) -> None:
        """Returns when target_address is the registered address of a
        registered node (of target_node, when named); PermissionDenied
        otherwise (Unavailable when the registry cannot be read)."""
        if self._fetch is None:
            raise PermissionDenied(f"replicate to {target_address}: this node has no scheduler (--scheduler) "
                                   "to learn registered nodes from, so it sends replicas nowhere "
                                   "(data_plane_auth is on)")
        if self._matches(self._snapshot(), target_node, target_address):
            return
        if self._refresh() and self._matches(self._snapshot(), target_node, target_address):
            return
        who = f"node {target_node!r} at {target_address}" if target_node else target_address
        raise PermissionDenied(f"replicate to {who}: not a registered node's registered address; "
                               "refused without connecting")

    @staticmethod
    def check_data_address(target_address: str, data_address: str) -> None:
        """The data plane address a target answered must be on its registered host."""
        if host_of(data_address) != host_of(target_address):
            raise PermissionDenied(f"target {target_address} answered data address {data_address}, not on its "
                                   "registered host; refused without connecting")

    def _snapshot(self) -> dict[str, str]:
        with self._lock:
            return self._nodes

    def _refresh(self) -> bool:
        """Reloads the registry unless a load started under min_refresh_s ago;
        whether the cache may have changed since the caller looked (it did
        load, or it waited for a load that was running)."""
        waited = not self._fetching.acquire(blocking=False)
        if waited:
            self._fetching.acquire()
        try:
            now = self._clock.now()
            with self._lock:
                if self._fetched_at is not None and now - self._fetched_at < self._min_refresh_s:
                    return waited
                self._fetched_at = now  # a failed fetch counts too: an unreachable scheduler is asked once a second
            assert self._fetch is not None
            nodes = dict(self._fetch())
            with self._lock:
                self._nodes = nodes
            return True
        finally:
            self._fetching.release()

    @staticmethod
    def _matches(nodes: Mapping[str, str], target_node: str, target_address: str) -> bool:
        if target_node:
            return nodes.get(target_node) == target_address
        return target_address in nodes.values()


def host_of(address: str) -> str:
    """The host part of host:port ([v6]:port too), lower-cased."""
    return address.rpartition(":")[0].strip("[]").lower()
