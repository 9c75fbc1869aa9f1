"""One node fed by two event sources: its kvstore and its engine's own KV events.

A node whose engine runs speckv's connector has two inventories: the
kvstore's tiers (its stream over SubscribeEvents) and the engine's own
prefix cache (vLLM's ZMQ KV events, `--kv-events NODE=...,kvstore=1`). The
holder index keeps one inventory per node, so fed directly by both, each
source would undo the other: the kvstore's SNAPSHOT replaces the node's
whole inventory (the engine's blocks with it), a gap in the engine's feed
resets it (the kvstore's blocks with it), and an engine's BlockRemoved
"GPU" drops a block the kvstore's device pool still holds.

SourceMerge stands in front of the index for such nodes and keeps, per
node, what each source holds in each tier. Rules:
- STORED and COMMITTED pass through unchanged (the index's store is
  idempotent), and the source is recorded as a holder in that tier.
- REMOVED passes through only for the blocks no other source holds in that
  tier (a block both hold leaves when the last one drops it).
- A source's SNAPSHOT, and its reset (a gap it cannot replay, a restart),
  replace only that source's holdings: the difference goes to the index as
  STORED (first) and REMOVED (filtered as above), never as a node-wide
  SNAPSHOT or reset.
- Registrations: the kvstore registers the node, so its stream is bound to
  one registration's generation (events of an older one are refused, and a
  new registration starts its stream from sequence 0). The engine's events
  outlive registrations: when the node's generation moves on (the
  registration wiped the node's index entries), the engine's holdings are
  sent again under the new generation, before anything else for the node.
  Before the node is first registered the engine's events are only
  recorded.
Removals made by a snapshot or a reset reach the index as REMOVED events,
so the reuse history counts them as removals (a node-wide snapshot would
not); that is the price of never dropping the other source's blocks.

Thread-safe (one lock; it calls the sink under it, so the lock order is
merge, then the sink's). Nodes not named at construction pass straight
through, at the cost of one dict lookup.
"""
from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field, replace
from typing import Iterable, Protocol, Sequence

from speckv.services.common.errors import NotFound
from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent


class EventSource(enum.Enum):
    KVSTORE = "kvstore"  # the node's kvstore: bound to one registration
    ENGINE = "engine"  # the engine's own KV events: outlive registrations

    @property
    def bound(self) -> bool:
        """Whether this source's stream starts over with each registration."""
        return self is EventSource.KVSTORE


class IndexSink(Protocol):
    """The scheduler core's side (SchedulerCore has both)."""

    def generation(self, node_id: str) -> int: ...  # NotFound for a node never registered

    def apply_kv_events(self, node_id: NodeId, generation: int, events: Sequence[IndexEvent]) -> bool: ...


@dataclass(slots=True)
class _NodeSources:
    held: dict[EventSource, dict[Tier, set[int]]] = field(
        default_factory=lambda: {source: {} for source in EventSource})
    synced: int | None = None  # the generation the index holds the engine's blocks under


class SourceMerge:
    def __init__(self, sink: IndexSink, nodes: Iterable[NodeId]) -> None:
        """nodes: those fed by both their kvstore and their engine."""
        self._sink = sink
        self._nodes = {node: _NodeSources() for node in nodes}
        self._lock = threading.Lock()

    def merges(self, node: NodeId) -> bool:
        return node in self._nodes

    def apply(self, node: NodeId, source: EventSource, generation: int | None,
              events: Sequence[IndexEvent]) -> bool:
        """Applies a source's events in order. generation: the registration a
        bound source's stream follows (ignored for the engine). False when a
        bound source's generation is stale, or the sink refuses its events
        (the node went down): its stream ends, as without the merge."""
        with self._lock:
            state = self._nodes[node]
            current = self._current(node)
            if source.bound and (current is None or generation != current):
                return False
            if current is not None:
                self._resync(node, state, current)
            out: list[IndexEvent] = []
            for event in events:
                out.extend(self._translate(state, source, event))
            if current is None or not out:
                return True
            applied = self._sink.apply_kv_events(node, current, out)
            return applied or not source.bound

    def reset(self, node: NodeId, source: EventSource, generation: int | None) -> bool:
        """Forgets what the source held (removing from the index what no
        other source holds); as apply for generation and the answer."""
        return self.apply(node, source, generation, [IndexEvent(HolderEventKind.SNAPSHOT, [])])

    def sync(self, node: NodeId) -> None:
        """Sends the engine's holdings again if the node registered anew
        since (the engine's feed calls this each heartbeat, so a quiet engine
        is indexed again after its kvstore re-registers)."""
        with self._lock:
            current = self._current(node)
            if current is not None:
                self._resync(node, self._nodes[node], current)

    def held(self, node: NodeId, source: EventSource, tier: Tier) -> frozenset[int]:
        """What the source holds in the tier, as last told."""
        with self._lock:
            return frozenset(self._nodes[node].held[source].get(tier, ()))

    def prefix(self, node: NodeId, source: EventSource, block_hashes: Sequence[int]) -> int:
        """Leading blocks of the chain the source holds in any tier."""
        with self._lock:
            tiers = [held for held in self._nodes[node].held[source].values() if held]
            n = 0
            for h in block_hashes:
                if not any(h in held for held in tiers):
                    break
                n += 1
            return n

    def _current(self, node: NodeId) -> int | None:
        try:
            return self._sink.generation(node)
        except NotFound:
            return None

    def _resync(self, node: NodeId, state: _NodeSources, current: int) -> None:
        if state.synced == current:
            return
        stores: list[IndexEvent] = []
        for source, tiers in state.held.items():
            if source.bound:
                tiers.clear()  # the registration wiped them; the new stream starts from sequence 0
                continue
            stores.extend(IndexEvent(HolderEventKind.STORED, list(blocks), has_parent=True, tier=tier)
                          for tier, blocks in tiers.items() if blocks)
        state.synced = current
        if stores:
            self._sink.apply_kv_events(node, current, stores)

    def _translate(self, state: _NodeSources, source: EventSource, event: IndexEvent) -> list[IndexEvent]:
        mine = state.held[source]
        if event.kind in (HolderEventKind.STORED, HolderEventKind.COMMITTED):
            mine.setdefault(event.tier, set()).update(event.block_hashes)
            return [event]
        if event.kind is HolderEventKind.REMOVED:
            held = mine.get(event.tier)
            if held:
                held.difference_update(event.block_hashes)
            gone = self._unheld(state, source, event.tier, event.block_hashes)
            return [replace(event, block_hashes=gone)] if gone else []
        return self._replace_holdings(state, source, _snapshot_tiers(event))

    def _replace_holdings(self, state: _NodeSources, source: EventSource,
                          new: dict[Tier, list[int]]) -> list[IndexEvent]:
        mine = state.held[source]
        stores: list[IndexEvent] = []
        removes: list[IndexEvent] = []
        for tier in Tier:
            old = mine.get(tier, set())
            blocks = new.get(tier, [])
            fresh = set(blocks)
            added = [h for h in blocks if h not in old]
            dropped = self._unheld(state, source, tier, [h for h in old if h not in fresh])
            mine[tier] = fresh
            if added:
                stores.append(IndexEvent(HolderEventKind.STORED, added, has_parent=True, tier=tier))
            if dropped:
                removes.append(IndexEvent(HolderEventKind.REMOVED, dropped, tier=tier))
        # Stores first: a block that moved between tiers is never out of the index in between.
        return stores + removes

    @staticmethod
    def _unheld(state: _NodeSources, source: EventSource, tier: Tier, blocks: Sequence[int]) -> list[int]:
        """The blocks no source other than `source` holds in the tier."""
        others = [tiers[tier] for other, tiers in state.held.items() if other is not source and tiers.get(tier)]
        if not others:
            return list(blocks)
        return [h for h in blocks if not any(h in held for held in others)]


def _snapshot_tiers(event: IndexEvent) -> dict[Tier, list[int]]:
    """A SNAPSHOT's blocks by tier (block_hashes are in event.tier)."""
    tiers: dict[Tier, list[int]] = {event.tier: list(event.block_hashes)}
    if event.host_hashes:
        tiers.setdefault(Tier.HOST, []).extend(event.host_hashes)
    if event.disk_hashes:
        tiers.setdefault(Tier.DISK, []).extend(event.disk_hashes)
    return tiers
