"""One node's KV store in simulation: which blocks it holds in which tier,
without bytes.

Each tier is a live kvstore BlockIndex (services/kvstore/index.py) with
its eviction strategy (services/kvstore/eviction.py: lapsed replicas first,
then LRU), so residency and eviction are the live store's by construction.
A chain's use touches it tail first, so its head is the most recent and is
evicted last; a replica's first use (a lookup hit or a re-put) clears its
lease. `pages` is the device tier's capacity in blocks, `host_pages` the
host tier's (0: no host tier): a put that does not fit evicts exactly as
many victims as it needs. Pages mean nothing here: every entry names page 0.

Tiers (write-back, as vLLM's CPU offloading and LMCache do): a block
evicted from the device tier by LRU is demoted to the host tier as its most
recent block, not dropped; a lapsed replica is dropped (a wrong guess is
given back, not kept). The host tier evicts by the same two rules, so a
demoted chain, whose tail went first, also leaves the host tier tail first.
A host hit is promoted by putting the prefix into the device tier; the host
copy stays, so the block is then in both tiers and its next demotion moves
nothing. A replica goes into the tier its order names.

What this keeps of its own is the store's glue without bytes: which tier a
put goes to, the write-back between tiers, and the outcome lists the
simulation turns into events (the live store's KVStoreCore does the same
steps with pages, a lock and an event log).

Disk (issue 44, docs/disk.md): with `disk_pages` > 0 a third tier below
the host tier takes what the host tier evicts (not a lapsed replica, not a
block the device tier holds), as the live store's writer does (its inline
writer: written within the eviction, no queue to overflow); the disk evicts
by LRU and what it evicts leaves the node. A disk block is held (lookup,
prefixes) and is promoted like a host-only block: the device put gives it a
device copy and the disk copy stays (the live store stages it through a
host page first; here the host tier is not charged that page). Off (0), the
node is the two-tier one, event for event. As the live store with its
inline writer: host victims go down in eviction order, each touched there
if the disk has it or written as its most recent block, unless the device
tier held it before the call; a chain's use touches its disk copies after
that write-back; a host put (a replica) writes a block only the disk holds
into the host tier; retention ends for what leaves both memory tiers. A
stage order (`stage`) reads a prefix's disk-only blocks into the host tier
(tests/unit/loadgen/sim/test_tiers_agree.py checks all of it step by step).

Retention (services/common/retention.py, the retain action): the node's
last tier (host, else device) passes over retained blocks with the live
store's rule, so a retained block is demoted but not dropped before its
deadline; `retain_max_blocks` caps how many are retained at once.

Simplifications, said here once: nothing is pinned (a replication source's
blocks could be evicted mid-copy; the copy still lands), and there are no
reservations (a replica takes its pages when it commits, not when it starts).
Not thread-safe; times are virtual seconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, cast

from speckv.services.common.ids import BlockHash
from speckv.services.common.retention import Retention
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.index import BlockEntry, BlockIndex
from speckv.services.kvstore.pool import PageId

_PAGE = PageId(0)  # the page every simulated entry names (no bytes here)


@dataclass(slots=True)
class PutOutcome:
    """What one put or promotion changed, in the order it happened.

    stored: newly in the put's tier; evicted: left the device tier;
    demoted: newly in the host tier by demotion; host_evicted: left the host
    tier; dropped: left the node (neither tier holds it now). With tiers,
    each list holds only what is still true at the end of the call (a block
    demoted and then evicted from the host tier in one call is not
    "demoted"), so the events built from it leave an index in the node's
    final state. Without a host tier dropped is evicted. disk_stored:
    newly on the disk (written back from the host tier); disk_evicted: left
    the disk."""

    stored: list[int]
    evicted: list[int]
    demoted: list[int]
    host_evicted: list[int]
    dropped: list[int]
    disk_stored: list[int]
    disk_evicted: list[int]
    host_lapsed: set[int]  # host victims that went as lapsed replicas: never written back

    @staticmethod
    def empty() -> PutOutcome:
        return PutOutcome([], [], [], [], [], [], [], set())


class _Tier:
    """One tier: its capacity in blocks, its live index, and the node's
    Retention when it is the node's last tier."""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self.index = BlockIndex()
        self.retention: Retention | None = None  # set on the node's last tier only

    def add(self, h: int, lease_deadline: float | None) -> None:
        """Indexes a new block as the most recent (a replica when leased)."""
        self.index.insert(BlockEntry(cast(BlockHash, h), _PAGE, lease_deadline=lease_deadline))

    def touch_chain(self, hashes: Sequence[int]) -> None:
        """A use of a chain (given head first, all resident): tail first (index.py)."""
        self.index.touch_chain(cast("Sequence[BlockHash]", hashes))

    def pop_victim(self, now: float, protect: set[int] | frozenset[int] = frozenset()) -> BlockEntry:
        """Removes and returns the next block to evict; the tier holds an
        unprotected block (nothing is pinned here)."""
        victim = self.index.pop_victim(now, cast("set[BlockHash] | frozenset[BlockHash]", protect), self.retention)
        assert victim is not None
        return victim


class SimKVNode:
    def __init__(self, node_id: str, pages: int, host_pages: int = 0, retain_max_blocks: int = 0,
                 disk_pages: int = 0) -> None:
        if pages <= 0:
            raise ValueError(f"pages={pages}: must be > 0")
        if host_pages < 0:
            raise ValueError(f"host_pages={host_pages}: must be >= 0 (0: no host tier)")
        if disk_pages < 0 or (disk_pages and not host_pages):
            raise ValueError(f"disk_pages={disk_pages}: must be >= 0, and a disk tier needs a host tier")
        self.node_id = node_id
        self.pages = pages
        self.host_pages = host_pages
        self._device = _Tier(pages)
        self._host: _Tier | None = _Tier(host_pages) if host_pages else None
        self._disk: _Tier | None = _Tier(disk_pages) if disk_pages else None
        self._retention: Retention | None = Retention(retain_max_blocks) if retain_max_blocks > 0 else None
        (self._host or self._device).retention = self._retention

    def retain(self, hashes: Sequence[int], until: float, now: float) -> int:
        """Retains the prefix of hashes the node holds until `until` (the
        cap allowing); returns the blocks retained. 0 without retention."""
        if self._retention is None:
            return 0
        return self._retention.retain(hashes[:self._memory_prefix(hashes)], until, now)

    def _memory_prefix(self, hashes: Sequence[int]) -> int:
        """The prefix held in the device or host tier (the live store's
        retain stops at a block only its disk holds: retention is the last
        memory tier's rule)."""
        dev, host, count = self._device.index, self._host, 0
        for h in hashes:
            if h not in dev and (host is None or h not in host.index):
                break
            count += 1
        return count

    def retained_blocks(self, now: float) -> int:
        """Blocks retained at now (what the kvstore's heartbeat reports)."""
        if self._retention is None:
            return 0
        self._retention.purge(now)
        return len(self._retention)

    def __len__(self) -> int:
        """Blocks on the node, in either tier."""
        host = self._host
        if host is None:
            return len(self._device.index)
        if self._disk is not None:
            return len(self.held_blocks())
        dev = self._device.index
        return len(dev) + sum(1 for h in host.index if h not in dev)

    def __contains__(self, block_hash: int) -> bool:
        host, disk = self._host, self._disk
        return (block_hash in self._device.index or (host is not None and block_hash in host.index)
                or (disk is not None and block_hash in disk.index))

    def held_blocks(self) -> set[int]:
        """Every block on the node, in any tier."""
        held: set[int] = set(self._device.index)
        if self._host is not None:
            held.update(self._host.index)
        if self._disk is not None:
            held.update(self._disk.index)
        return held

    def tier_count(self, tier: Tier) -> int:
        """Blocks the tier holds."""
        if tier is Tier.DEVICE:
            return len(self._device.index)
        found = self._disk if tier is Tier.DISK else self._host
        return 0 if found is None else len(found.index)

    def in_tier(self, block_hash: int, tier: Tier) -> bool:
        if tier is Tier.DEVICE:
            return block_hash in self._device.index
        found = self._disk if tier is Tier.DISK else self._host
        return found is not None and block_hash in found.index

    @property
    def free_pages(self) -> int:
        """What a replica could get in the device tier: free plus evictable (nothing is pinned here)."""
        return self.pages

    def lookup(self, hashes: Sequence[int]) -> int:
        """Blocks of the longest prefix held in either tier; touches them (a use)."""
        n = self._longest_prefix(hashes)
        host = self._host
        if host is None:
            self._device.touch_chain(hashes[:n])
            return n
        dev, hidx = self._device.index, host.index
        self._device.touch_chain([h for h in hashes[:n] if h in dev])
        host.touch_chain([h for h in hashes[:n] if h in hidx])
        if self._disk is not None:
            self._disk.touch_chain([h for h in hashes[:n] if h in self._disk.index])
        return n

    def host_only(self, hashes: Sequence[int], length: int) -> int:
        """How many of the first length hashes only the tiers below the
        device hold (host or disk: what a promotion copies up)."""
        if self._host is None:
            return 0
        dev = self._device.index
        return sum(1 for h in hashes[:length] if h not in dev)

    def disk_only(self, hashes: Sequence[int], length: int) -> int:
        """How many of the first length hashes only the disk tier holds
        (of host_only's: what a promotion reads from the disk first)."""
        return len(self.disk_only_hashes(hashes, length)) if self._disk is not None else 0

    def disk_only_hashes(self, hashes: Sequence[int], length: int) -> list[int]:
        """The first length hashes that only the disk tier holds, in order."""
        if self._disk is None:
            return []
        dev, didx = self._device.index, self._disk.index
        hidx = self._host.index if self._host is not None else ()
        return [h for h in hashes[:length] if h in didx and h not in dev and h not in hidx]

    def stage(self, hashes: Sequence[int], now: float) -> PutOutcome:
        """A stage order's landing (issue 44): the blocks of the prefix held
        that only the disk holds go into the host tier head first, as the
        live store's _stage_from_disk inserts them, the host tier evicting
        what they need (never the chain's own host copies; what it evicts
        is written back to the disk); the disk keeps its copies, touched
        before the write-back (the live store's read pins them, then gives
        them back as the most recent) and after it (the live store's touch
        once staged). stored: what went into the host tier."""
        out = PutOutcome.empty()
        host, disk = self._host, self._disk
        if host is None or disk is None:
            return out
        prefix = hashes[:self._longest_prefix(hashes)]
        dev, hlru, dlru = self._device.index, host.index, disk.index
        up = [h for h in dict.fromkeys(prefix) if h in dlru and h not in dev and h not in hlru]
        if not up:
            return out
        disk.touch_chain(up)
        present = {h for h in prefix if h in hlru}
        up = up[:max(0, host.pages - len(present))]
        for _ in range(max(0, len(up) - (host.pages - len(hlru)))):
            self._pop_host(now, present, out)
        for h in up:
            host.add(h, None)
            out.stored.append(h)
        self._settle(out, now)
        disk.touch_chain([h for h in up if h in dlru])  # after the write-back, as the live store touches them
        return out

    def holds_all(self, hashes: Sequence[int]) -> bool:
        return self._longest_prefix(hashes) == len(hashes)

    def put(self, hashes: Sequence[int], now: float, lease_deadline: float | None = None,
            tier: Tier = Tier.DEVICE, promote: bool = False) -> PutOutcome:
        """Stores a chain (head first) in tier; new blocks evict as needed,
        and the whole chain counts as a use with its head most recent.
        lease_deadline marks new blocks as speculative replicas: then, as the
        live store publishes a replica, they go in tail first and resident
        ones are left as they are. A device put of host-only blocks gives
        them a device copy; promote says it is their promotion (the live
        store's promote, which pins their host copies meanwhile: the
        demotions it causes do not push them out of the host tier). A host
        put skips blocks the node holds in either memory tier."""
        if tier is Tier.HOST:
            return self._put_host(hashes, now, lease_deadline)
        out = PutOutcome.empty()
        stored, evicted = out.stored, out.evicted
        device = self._device
        lru = device.index
        host = self._host
        pinned = {h for h in hashes if h not in lru and h in host.index} if promote and host is not None else None
        order = list(hashes)
        if lease_deadline is not None:
            order.reverse()
        else:  # resident blocks of the chain are a use now: no insert below may evict them (the live store protects them)
            device.touch_chain([h for h in hashes if h in lru])
        lapsed: list[int] = []  # victims that went as lapsed replicas (with a host tier)
        if device.retention:
            # All victims first, as the live store allocates a put's pages at
            # once: passing over retained blocks moves them behind what this
            # put inserts, which must not then be its victims. Without
            # retention, evicting as it goes takes the same victims.
            resident = {h for h in order if h in lru}  # protected as the live store protects them
            for _ in range(min(len(lru) - len(resident), len(lru) + len(order) - len(resident) - device.pages)):
                evicted.append(device.pop_victim(now, resident).block_hash)
        # This loop runs for every block of every prompt in the simulation.
        for h in order:
            if h in lru:
                continue
            if len(lru) >= device.pages:
                entry = device.pop_victim(now)
                evicted.append(entry.block_hash)
                # Without protect or retention (the device tier has neither
                # when a host tier is below it) a victim whose lease lapsed
                # went by rule 1: the index keeps a heap entry for every live
                # lease, so rule 2 runs only when none has lapsed. The live
                # store's _demote tells them apart the same way.
                if host is not None and entry.lease_deadline is not None and entry.lease_deadline <= now:
                    lapsed.append(entry.block_hash)
            device.add(h, lease_deadline)
            stored.append(h)
        if lease_deadline is not None:
            stored.reverse()
        else:  # a chain longer than the pool evicts its own head: touch what is left
            device.touch_chain([h for h in hashes if h in lru])
        if host is None:
            out.dropped = evicted
            if self._retention and evicted:
                self._retention.release([h for h in evicted if h not in lru])
            return out
        if evicted:
            self._demote(evicted, set(lapsed), now, out, pinned)
        if lease_deadline is None:
            host.touch_chain([h for h in hashes if h in host.index])  # a use of the host copies too
        self._settle(out, now)
        if lease_deadline is None and self._disk is not None:
            # and of the disk copies, after the write-back, as the live store's _touch
            self._disk.touch_chain([h for h in hashes if h in self._disk.index])
        return out

    def _put_host(self, hashes: Sequence[int], now: float, lease_deadline: float | None) -> PutOutcome:
        host = self._host
        if host is None:
            raise ValueError(f"node {self.node_id} has no host tier")
        out = PutOutcome.empty()
        dev, lru = self._device.index, host.index
        if lease_deadline is None:
            host.touch_chain([h for h in hashes if h in lru])
        present = {h for h in hashes if h in lru}  # never evicted to make room for the rest, as live
        # A block only the disk holds is written into the host tier like a
        # new one (the live store's reserve needs what neither memory tier
        # holds); its disk copy stays.
        needed = sum(1 for h in dict.fromkeys(hashes) if h not in lru and h not in dev)
        if needed > host.pages - len(present):
            self._settle(out, now)
            return out  # no room without evicting the chain itself: the live store refuses the reservation
        # All the room first, as the live store reserves it at once (passing
        # over retained blocks must not move them behind what this put inserts).
        for _ in range(max(0, needed - (host.pages - len(lru)))):
            self._pop_host(now, present, out)
        for h in reversed(hashes) if lease_deadline is not None else hashes:
            if h in lru or h in dev:
                continue
            host.add(h, lease_deadline)
            out.stored.append(h)
        if lease_deadline is not None:
            out.stored.reverse()
        self._settle(out, now)
        return out

    def _demote(self, victims: list[int], lapsed: set[int], now: float, out: PutOutcome,
                pinned: set[int] | None = None) -> None:
        """The write-back of one call's device victims, in the live store's
        steps (KVStoreCore._demote): lapsed replicas are dropped; victims the
        host tier holds already are touched there, in eviction order; the
        others go in as its most recent blocks, in eviction order, after the
        host tier has evicted all the room they need at once (never pinned,
        the host copies a promotion reads); what the tier cannot hold at all
        is dropped."""
        host = self._host
        assert host is not None
        lru = host.index
        kept = [v for v in victims if v not in lapsed] if lapsed else victims
        room = host.pages - (len(pinned) if pinned else 0)
        down = [v for v in kept if v not in lru][:room]  # what cannot fit is dropped
        host.touch_chain([v for v in reversed(kept) if v in lru])
        shortfall = len(down) - (host.pages - len(lru))
        for _ in range(max(0, shortfall)):
            self._pop_host(now, pinned or frozenset(), out)
        for v in down:
            host.add(v, None)
        out.demoted.extend(down)

    def _pop_host(self, now: float, protect: set[int] | frozenset[int], out: PutOutcome) -> None:
        """Evicts the host tier's next victim into out (a lapsed replica noted: it is not written back)."""
        assert self._host is not None
        entry = self._host.pop_victim(now, protect)
        out.host_evicted.append(entry.block_hash)
        if entry.lease_deadline is not None and entry.lease_deadline <= now:
            out.host_lapsed.add(entry.block_hash)

    def _write_back(self, out: PutOutcome, now: float) -> None:
        """The disk's share of one call: the host tier's victims that left
        it (not to the device, not lapsed replicas) go onto the disk as its
        most recent blocks, its LRU blocks making room."""
        disk, host = self._disk, self._host
        assert disk is not None and host is not None
        dev, hlru, dlru = self._device.index, host.index, disk.index
        # The live store offers a host victim to the disk unless the device
        # tier holds it at that moment: a block this call stored in the
        # device tier was not there yet (the live store allocates, evicting,
        # before it writes), so it goes down too.
        fresh = set(out.stored)
        down = [h for h in dict.fromkeys(out.host_evicted)
                if h not in hlru and (h not in dev or h in fresh) and h not in out.host_lapsed]
        for h in down:  # in eviction order, each touched or written as it comes (the live inline writer)
            if h in dlru:
                dlru.touch(cast(BlockHash, h))
                continue
            if len(dlru) >= disk.pages:
                out.disk_evicted.append(disk.pop_victim(now).block_hash)
            disk.add(h, None)
            out.disk_stored.append(h)
        out.disk_stored = [h for h in out.disk_stored if h in dlru]
        out.disk_evicted = [h for h in dict.fromkeys(out.disk_evicted) if h not in dlru]

    def _settle(self, out: PutOutcome, now: float = 0.0) -> None:
        """Keeps in each list only what holds at the end of the call (PutOutcome)."""
        host = self._host
        assert host is not None
        if self._disk is not None:
            self._write_back(out, now)
        dev, hlru = self._device.index, host.index
        out.demoted = [h for h in dict.fromkeys(out.demoted) if h in hlru]
        out.evicted = [h for h in dict.fromkeys(out.evicted) if h not in dev]
        out.host_evicted = [h for h in dict.fromkeys(out.host_evicted) if h not in hlru]
        left_device = set(out.evicted)
        dlru = self._disk.index if self._disk is not None else ()
        out.dropped = ([h for h in out.evicted if h not in hlru and h not in dlru]
                       + [h for h in out.host_evicted if h not in dev and h not in left_device and h not in dlru])
        if dlru:
            gone = set(out.dropped)
            out.dropped += [h for h in out.disk_evicted if h not in dev and h not in hlru and h not in gone]
        if self._retention:
            # What left both memory tiers, to the disk or off the node (the
            # live store's _settle_retention: retention is a memory tier's rule).
            left = [h for h in dict.fromkeys(out.evicted + out.host_evicted) if h not in dev and h not in hlru]
            if left:
                self._retention.release(left)

    def _longest_prefix(self, hashes: Sequence[int]) -> int:
        dev, count = self._device.index, 0
        host = self._host
        if host is None:
            for h in hashes:
                if h not in dev:
                    break
                count += 1
            return count
        hlru = host.index
        dlru = self._disk.index if self._disk is not None else ()
        for h in hashes:
            if h not in dev and h not in hlru and h not in dlru:
                break
            count += 1
        return count
