"""Bringing a node's blocks up to its device tier in virtual time: those
only its disk holds are read first over its disk (bytes over the disk's
read rate plus its per-load overhead: a disk profile of
services/config/disks.json as a Network link, one per node), then every
block crosses the host link as a host hit does (the live store stages a
disk block into a host page, then promotes it). Without a disk (or with no
disk-only block) it is the host link's copy alone, as before disks.

A stage order's read in flight (StageReads) is joined, not repeated: a
request (or another stage) needing some of the blocks it reads waits for
that read to land instead of reading them again behind it, as the live
store's readers wait for a read of the same block already in flight
(store_disk.py); only the blocks no stage is reading are read on its own.

A pull whose source holds some of the pulled blocks on its disk alone reads
them off the source's disk too (`pull`): the live source stages them from
its disk before it serves them (store_disk.py), and the router prices the
pull as max(wire, source's disk read + host copy) (router.py, fetch_n), so
the simulated read starts with the network transfer and the pull lands when
both have: max(wire, disk read) uncontended, each sharing its link with
whatever else is on it (the source's own disk loads, its stage reads). The
scheduler books the same read on the source's disk (DiskBacklog, through
the route's observation). Not modelled: the source's host page that the
live read goes through (the request path's promotions leave it out too),
and the source's host link copy (a pull never charged it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from speckv.loadgen.sim.network import Network, Transfer
from speckv.services.common.ids import NodeId

if TYPE_CHECKING:
    from speckv.loadgen.sim.simulation import Simulation


@dataclass(slots=True)
class StageRead:
    """One stage order's read in flight: who waits for it to land."""

    hashes: list[int]
    waiters: list[Callable[[], None]] = field(default_factory=list)


class StageReads:
    """The stage reads in flight on each node of one simulation, by block."""

    def __init__(self) -> None:
        self._by_node: dict[NodeId, dict[int, StageRead]] = {}
        self.joined_blocks = 0  # blocks a request or stage took from a stage in flight instead of reading them
        self.joined_reads = 0  # reads that joined one

    def split(self, node: NodeId, hashes: Sequence[int]) -> tuple[list[int], list[StageRead]]:
        """(the hashes no stage on node is reading, the reads that read the others)."""
        flight = self._by_node.get(node)
        if not flight:
            return list(hashes), []
        own, joined = [], {}
        for h in hashes:
            read = flight.get(h)
            if read is None:
                own.append(h)
            else:
                joined[id(read)] = read
        if joined:
            self.joined_blocks += len(hashes) - len(own)
            self.joined_reads += 1
        return own, list(joined.values())

    def begin(self, node: NodeId, hashes: Sequence[int]) -> StageRead:
        read = StageRead(list(hashes))
        flight = self._by_node.setdefault(node, {})
        for h in hashes:
            flight[h] = read
        return read

    def end(self, node: NodeId, read: StageRead) -> None:
        """read landed: it is no longer joinable; its waiters go on."""
        flight = self._by_node.get(node, {})
        for h in read.hashes:
            if flight.get(h) is read:
                del flight[h]
        for waiter in read.waiters:
            waiter()
        read.waiters.clear()


def after_disk(sim: Simulation, node: NodeId, disk_hashes: Sequence[int], then: Callable[[], None],
               stage: bool = False) -> StageRead | None:
    """Reads disk_hashes (blocks only node's disk holds) off its disk,
    joining the stage reads in flight for those they read, then runs then().
    stage: this is a stage order's read, joinable by others until it lands
    (returned; the caller ends it with sim.stage_reads.end)."""
    disk_links = sim.disk_links
    if not disk_hashes or disk_links is None:
        then()
        return None
    own, joined = sim.stage_reads.split(node, disk_hashes)
    mine = sim.stage_reads.begin(node, own) if stage and own else None
    left = [len(joined) + (1 if own else 0)]

    def one_done(_read: Transfer | None = None) -> None:
        left[0] -= 1
        if not left[0]:
            then()

    for read in joined:
        read.waiters.append(one_done)
    if own:
        disk_links.start(f"{node}/disk", node, len(own) * sim.config.real_bytes_per_block, one_done)
    return mine


def stage_up(sim: Simulation, node: NodeId, blocks: int, disk_hashes: Sequence[int],
             on_done: Callable[[Transfer], None]) -> None:
    """Starts moving blocks (below node's device tier; disk_hashes the ones
    on its disk alone) up to its device tier; on_done runs when the host
    link's copy lands. sim.host_links is not None."""
    nbytes = sim.config.real_bytes_per_block
    host_links = sim.host_links
    assert host_links is not None

    def copy() -> None:
        host_links.start(f"{node}/host", node, blocks * nbytes, on_done)

    after_disk(sim, node, disk_hashes, copy)


def pull(sim: Simulation, source: NodeId, target: NodeId, hashes: Sequence[int], nbytes: int,
         on_done: Callable[[Transfer], None]) -> int:
    """Starts a pull of hashes (the blocks beyond target's prefix, head
    first; nbytes their bytes on the wire) from source to target over
    sim.network; those only source's disk holds are read off it meanwhile
    (joining a stage in flight there, as after_disk does). on_done runs with
    the network transfer once both have landed. Returns how many blocks were
    read off source's disk."""
    network: Network = sim.network
    from_disk = sim.kv[source].disk_only_hashes(hashes, len(hashes)) if sim.disk_links is not None else []
    if not from_disk:
        network.start(source, target, nbytes, on_done)
        return 0
    # The wire's transfer, once in; popped when handed on: held here it
    # closes a cycle (transfer -> wire_done -> landed -> transfer) that
    # the simulation, which runs without the cyclic collector, must not leave.
    landed: list[Transfer] = []
    left = [2]  # legs still running: the wire, the disk read

    def leg_done() -> None:
        left[0] -= 1
        if not left[0]:
            on_done(landed.pop())

    def wire_done(transfer: Transfer) -> None:
        landed.append(transfer)
        leg_done()

    network.start(source, target, nbytes, wire_done)
    after_disk(sim, source, from_disk, leg_done)
    return len(from_disk)
