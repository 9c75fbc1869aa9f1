"""The KV events one simulated put makes (kvnode.PutOutcome), in the order
that leaves the scheduler's holder index in the node's final state: stored,
demoted to the host tier, written back to the disk, evicted from the device
tier, evicted from the host tier, evicted from the disk. A block written
back to the disk is STORED(STORAGE) before its REMOVED(CPU), so the index
keeps it held; a demotion or a write-back never starts a chain (its blocks
were held already).
"""
from __future__ import annotations

from speckv.loadgen.sim.kvnode import PutOutcome
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent


def outcome_events(out: PutOutcome, root: int, family: str, kind: HolderEventKind = HolderEventKind.STORED,
                   tier: Tier = Tier.DEVICE) -> list[IndexEvent]:
    """The events of out; stored blocks start a chain when their first is root."""
    events = []
    if out.stored:
        events.append(IndexEvent(kind, out.stored, has_parent=out.stored[0] != root, family=family, tier=tier))
    if out.demoted:
        events.append(IndexEvent(HolderEventKind.STORED, out.demoted, has_parent=True, family=family,
                                 tier=Tier.HOST))
    if out.disk_stored:
        events.append(IndexEvent(HolderEventKind.STORED, out.disk_stored, has_parent=True, family=family,
                                 tier=Tier.DISK))
    if out.evicted:
        events.append(IndexEvent(HolderEventKind.REMOVED, out.evicted, tier=Tier.DEVICE))
    if out.host_evicted:
        events.append(IndexEvent(HolderEventKind.REMOVED, out.host_evicted, tier=Tier.HOST))
    if out.disk_evicted:
        events.append(IndexEvent(HolderEventKind.REMOVED, out.disk_evicted, tier=Tier.DISK))
    return events
