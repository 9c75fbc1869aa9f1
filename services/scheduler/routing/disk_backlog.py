"""How long each node's disk is already spoken for by reads the scheduler
itself caused: the disk loads of the requests it routed there and the stage
orders it issued (issue 44; the disk's counterpart of link_backlog.py).

Why: a node's disk serves one read queue. A stage of a few dozen 64 MiB
blocks holds it for hundreds of ms, and a request that must load its own
blocks off that disk meanwhile waits behind it. Priced as an idle disk, the
router and the planner expect 188 ms where the simulator measured 1,148
(docs/disk.md, "Staging ahead of the return").

Model: each node's disk is a FIFO. A read of B bytes starts when the disk is
free (or now) and holds it for disk.transfer_ms(B); its completion becomes
the node's `busy_until`. Under the processor sharing of the simulator's disk
(and a drive's several requests in flight) a newcomer finishes no later than
FIFO says: an upper bound that relaxes as time passes. Times are seconds on
the scheduler's clock. Reads the scheduler did not cause (another
scheduler's routes, re-indexing at start) are not seen.

A stage in flight is also remembered by the chain it stages (its block
hashes, until it is expected to land): a request whose prefix on that node
ends inside the chain joins it (the kvstore's and the simulator's reads wait
for a read of the same block already in flight) and waits for that stage's
end, not behind it for a read of its own.

Load rates: each route that loads blocks off a node's disk counts one on it,
in an exponentially decayed count (half-life rate_halflife_s); rate_per_s is
that count over the half-life's mean life (halflife / ln 2), so a steady r
a second reads r. The planner prices the delay a stage adds to those loads
with it (value.link_delay_ms). Not thread-safe: SchedulerCore serialises
access.
"""
from __future__ import annotations

import math
from typing import Iterable

from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.ids import NodeId


class DiskBacklog:
    def __init__(self, disk: LinkModel | None, rate_halflife_s: float = 30.0) -> None:
        """disk None: no disk model (disk blocks priced as host hits): nothing is booked."""
        self._disk = disk
        self._busy_until: dict[NodeId, float] = {}
        self._halflife_s = rate_halflife_s
        self._loads: dict[NodeId, tuple[float, float]] = {}  # node -> (decayed count, at s)
        self._staging: dict[NodeId, dict[int, float]] = {}  # node -> block hash -> its stage's end (s)

    def wait_ms(self, node: NodeId, now: float) -> float:
        """How long until node's disk finishes what it was given (ms, >= 0)."""
        busy = self._busy_until.get(node)
        return 0.0 if busy is None or busy <= now else (busy - now) * 1e3

    def add(self, node: NodeId, nbytes: int, now: float) -> float:
        """Books a read of nbytes off node's disk; returns when it is expected to end (s)."""
        if self._disk is None:
            return now
        start = max(now, self._busy_until.get(node, now))
        end = start + self._disk.transfer_ms(nbytes) / 1e3
        self._busy_until[node] = end
        return end

    def add_stage(self, node: NodeId, chain: Iterable[int], disk_blocks: int, bytes_per_block: int,
                  now: float) -> float:
        """Books a stage reading disk_blocks blocks of chain (a prefix: its
        block hashes, head first) off node's disk; remembers the chain until
        the read ends. Returns that end (s)."""
        end = self.add(node, disk_blocks * bytes_per_block, now)
        if end <= now:
            return end  # nothing read (or no disk model): nothing to join
        staging = self._staging.setdefault(node, {})
        for h in chain:
            staging[h] = max(end, staging.get(h, end))
        return end

    def joined_ms(self, node: NodeId, last_hash: int, now: float) -> float | None:
        """ms until the stage in flight on node whose chain holds last_hash
        lands, None when there is none: a request whose blocks on node end at
        last_hash (chained hashes: the whole prefix up to it is in that
        chain, so every disk block of it is in the stage's read) waits for
        that stage instead of reading them behind it."""
        staging = self._staging.get(node)
        end = staging.get(last_hash) if staging else None
        return None if end is None or end <= now else (end - now) * 1e3

    def note_load(self, node: NodeId, now: float) -> None:
        """A route that loads blocks off node's disk."""
        self._loads[node] = (self._decayed(node, now) + 1.0, now)

    def rate_per_s(self, node: NodeId, now: float) -> float:
        """Recent disk loads per second on node."""
        return self._decayed(node, now) * math.log(2) / self._halflife_s

    def rates(self, now: float) -> dict[NodeId, float]:
        return {n: self.rate_per_s(n, now) for n in self._loads}

    def waits(self, now: float) -> dict[NodeId, float]:
        return {n: self.wait_ms(n, now) for n in self._busy_until if self._busy_until[n] > now}

    def _decayed(self, node: NodeId, now: float) -> float:
        count, at = self._loads.get(node, (0.0, now))
        return count * math.exp2(-max(0.0, now - at) / self._halflife_s)

    def forget(self, node: NodeId) -> None:
        """A node that re-registered or left: its old reads are gone."""
        self._busy_until.pop(node, None)
        self._loads.pop(node, None)
        self._staging.pop(node, None)

    def prune(self, now: float) -> None:
        """Drops disks idle by now and stages landed (bounds the maps by busy disks)."""
        self._busy_until = {n: t for n, t in self._busy_until.items() if t > now}
        self._loads = {n: (c, at) for n, (c, at) in self._loads.items()
                       if c * math.exp2(-max(0.0, now - at) / self._halflife_s) > 1e-3}
        self._staging = {n: kept for n, s in self._staging.items()
                         if (kept := {h: t for h, t in s.items() if t > now})}
