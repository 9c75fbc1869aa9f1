"""The client's own placement when the scheduler cannot answer: prefix
affinity by rendezvous hashing, bounded by load, else the least loaded.

Algorithm (deterministic: the same state gives the same node):

1. Candidates: the nodes the client knows (KnownNodes: seeded by the router,
   learned from the scheduler's answers) that are not marked down.
2. Load of a node: the prompt tokens of the requests this client routed to
   it (by the scheduler or by this fallback) that have not finished. It is
   all a client sees without the scheduler; a router that is one of several
   sees its own share.
3. Affinity: a request with at least one full block ranks the candidates by
   rendezvous (highest random weight) hashing of its FIRST block hash: score
   = the first 8 bytes of BLAKE2b(first block hash as 8 little-endian bytes
   || node id), highest first. Requests of one prefix family share their
   first block, so they land on one node, whose engine then holds their
   prefix in its own cache; a node that joins or leaves moves only the
   prefixes that rank it first (about 1/n of them), unlike `hash mod n`.
4. Bounded load (consistent hashing with bounded loads, Mirrokni, Thorup and
   Zadimoghaddam 2018): the request goes to the highest-ranked candidate
   whose load after taking it stays within
   `load_factor` x (total load + the request's tokens) / candidates
   + `slack_tokens`; defaults 1.25 and 8,192 tokens (a few prompts' worth,
   so an idle cluster keeps every family on its affinity node and a hot
   family spills only once its node carries over a quarter more than the mean).
5. No full block, or no candidate within the bound: the least loaded
   candidate, ties broken by the rendezvous rank (a prompt without blocks
   ranks by node id).

What it cannot know: which blocks each node caches, queues other routers
made, forecasts. So its TTFT sits between the `none` policy's (which knows
the cached prefixes) and a random choice; prefix affinity is what keeps it
near the former.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Iterable, Sequence

from speckv.services.common.errors import require
from speckv.services.common.ids import UINT64_MAX, NodeId


@dataclass(frozen=True, slots=True)
class FallbackSettings:
    """load_factor >= 1 (1: strict balance); slack_tokens >= 0 (module docstring, step 4)."""

    load_factor: float = 1.25
    slack_tokens: int = 8_192

    def __post_init__(self) -> None:
        require(self.load_factor >= 1.0, f"load_factor must be >= 1, not {self.load_factor}")
        require(self.slack_tokens >= 0, f"slack_tokens must be >= 0, not {self.slack_tokens}")


def rendezvous_score(first_block: int, node: str) -> int:
    """The highest-random-weight score of a node for a prefix (module docstring, step 3)."""
    key = (first_block & UINT64_MAX).to_bytes(8, "little")  # a hash outside uint64 is taken mod 2^64
    digest = hashlib.blake2b(key + node.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def rendezvous_order(first_block: int | None, nodes: Iterable[str]) -> list[str]:
    """Nodes by rendezvous rank for a prefix, best first; by node id without one."""
    if first_block is None:
        return sorted(nodes)
    return sorted(nodes, key=lambda n: (-rendezvous_score(first_block, n), n))


class KnownNodes:
    """What the client knows of the cluster: each node's address, whether the
    router marked it down, and its load (prompt tokens of this client's
    unfinished routes). Thread-safe. Invariant: load[n] equals the sum of the
    tokens of the open routes placed on n."""

    __slots__ = ("_lock", "_addresses", "_down", "_load", "_open")

    def __init__(self, seeds: dict[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._addresses: dict[NodeId, str] = {NodeId(n): a for n, a in (seeds or {}).items()}
        self._down: set[NodeId] = set()
        self._load: dict[NodeId, int] = {}
        self._open: dict[str, tuple[NodeId, int]] = {}  # request id -> (node, tokens)

    def learn(self, node: str, address: str) -> None:
        """A node the scheduler named (with its address): known from now on, and up."""
        with self._lock:
            if address or node not in self._addresses:
                self._addresses[NodeId(node)] = address
            self._down.discard(NodeId(node))

    def mark_down(self, node: str) -> None:
        with self._lock:
            self._down.add(NodeId(node))

    def mark_up(self, node: str) -> None:
        with self._lock:
            self._down.discard(NodeId(node))

    def address(self, node: str) -> str:
        with self._lock:
            return self._addresses.get(NodeId(node), "")

    def opened(self, request_id: str, node: str, tokens: int) -> None:
        """A route placed request_id on node; a request id routed again moves its load."""
        with self._lock:
            self._close(request_id)
            self._open[request_id] = (NodeId(node), max(0, tokens))
            self._load[NodeId(node)] = self._load.get(NodeId(node), 0) + max(0, tokens)

    def closed(self, request_id: str) -> None:
        """The request finished (or failed): its tokens leave its node's load. Unknown ids are ignored."""
        with self._lock:
            self._close(request_id)

    def snapshot(self) -> dict[NodeId, int]:
        """Candidates (known, not down) and their loads."""
        with self._lock:
            return {n: self._load.get(n, 0) for n in self._addresses if n not in self._down}

    def _close(self, request_id: str) -> None:
        placed = self._open.pop(request_id, None)
        if placed is not None:
            node, tokens = placed
            self._load[node] -= tokens


class FallbackStrategy:
    """Chooses a node by the module docstring's algorithm; None without a candidate."""

    __slots__ = ("_settings",)

    def __init__(self, settings: FallbackSettings = FallbackSettings()) -> None:
        self._settings = settings

    def choose(self, block_hashes: Sequence[int], prompt_tokens: int, loads: dict[NodeId, int]) -> NodeId | None:
        if not loads:
            return None
        first = block_hashes[0] if block_hashes else None
        ranked = rendezvous_order(first, loads)
        tokens = max(0, prompt_tokens)
        if first is not None:
            mean = (sum(loads.values()) + tokens) / len(loads)
            bound = self._settings.load_factor * mean + self._settings.slack_tokens
            for node in ranked:
                if loads[NodeId(node)] + tokens <= bound:
                    return NodeId(node)
        least = min(loads[NodeId(n)] for n in ranked)
        return next(NodeId(n) for n in ranked if loads[NodeId(n)] == least)
