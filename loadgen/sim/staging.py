"""Bringing a node's blocks up to its device tier in virtual time: those
only its disk holds are read first over its disk (bytes over the disk's
read rate plus its per-load overhead: a disk profile of
services/config/disks.json as a Network link, one per node), then every
block crosses the host link as a host hit does (the live store stages a
disk block into a host page, then promotes it). Without a disk (or with no
disk-only block) it is the host link's copy alone, as before disks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from speckv.loadgen.sim.network import Transfer
from speckv.services.common.ids import NodeId

if TYPE_CHECKING:
    from speckv.loadgen.sim.simulation import Simulation


def stage_up(sim: Simulation, node: NodeId, blocks: int, disk_blocks: int,
             on_done: Callable[[Transfer], None]) -> None:
    """Starts moving blocks (below node's device tier; disk_blocks of them
    on its disk alone) up to its device tier; on_done runs when the host
    link's copy lands. sim.host_links is not None."""
    nbytes = sim.config.real_bytes_per_block
    host_links = sim.host_links
    assert host_links is not None

    def copy(_read: Transfer | None = None) -> None:
        host_links.start(f"{node}/host", node, blocks * nbytes, on_done)

    if disk_blocks > 0 and sim.disk_links is not None:
        sim.disk_links.start(f"{node}/disk", node, disk_blocks * nbytes, copy)
    else:
        copy()
