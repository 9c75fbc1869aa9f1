"""The two feeds of a node whose engine's own KV events join its kvstore's
(`--kv-events NODE=...,kvstore=1`), wired through one SourceMerge
(source_merge.py holds the rules).

- KVStoreEvents: the apply/reset pair event_sync.py's streams call. A node
  the merge covers goes through it as the KVSTORE source; any other node goes
  straight to the core, as before.
- EngineSourceSink: the NodeSink (vllm_subscriber.py) of the engine's feed.
  It registers nothing and reports no liveness (the kvstore registers the
  node and heartbeats it); its generation is a constant, so the feed never
  ends on a re-registration, which the merge follows instead; its heartbeat
  tick lets the merge send the engine's blocks again after one. The engine
  declared dead by its health probe (node_lost) costs the node the engine's
  source only: it is reset, the kvstore's blocks stay and the node stays up.
- EngineAwareConfirm: Route's confirming Lookup asks the kvstore, which
  knows its own tiers only; the engine's cache is known from its events. The
  node holds the longer of the two prefixes.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.cluster import LoadReport
from speckv.services.scheduler.holder_index import IndexEvent
from speckv.services.scheduler.ports import PrefixConfirmer
from speckv.services.scheduler.source_merge import EventSource, SourceMerge

ENGINE_FEED_GENERATION = 0  # what the engine's feed is told: constant, as it never registers


class CoreEvents(Protocol):
    """The core's event entry points (SchedulerCore has them)."""

    def apply_kv_event(self, node_id: NodeId, generation: int, event: IndexEvent) -> bool: ...

    def reset_inventory(self, node_id: NodeId, generation: int) -> bool: ...


class KVStoreEvents:
    """event_sync.py's ApplyFn and ResetFn, merge-aware."""

    def __init__(self, core: CoreEvents, merge: SourceMerge) -> None:
        self._core, self._merge = core, merge

    def apply_kv_event(self, node_id: NodeId, generation: int, event: IndexEvent) -> bool:
        if self._merge.merges(node_id):
            return self._merge.apply(node_id, EventSource.KVSTORE, generation, [event])
        return self._core.apply_kv_event(node_id, generation, event)

    def reset_inventory(self, node_id: NodeId, generation: int) -> bool:
        if self._merge.merges(node_id):
            return self._merge.reset(node_id, EventSource.KVSTORE, generation)
        return self._core.reset_inventory(node_id, generation)


class EngineSourceSink:
    """vllm_subscriber.NodeSink for engines beside a kvstore."""

    def __init__(self, merge: SourceMerge) -> None:
        self._merge = merge

    def register_node(self, node_id: str, address: str, sizes: NodeSizes,
                      geometry: KVGeometry | None) -> tuple[bool, int]:
        return False, 0  # the node's kvstore registers it

    def generation(self, node_id: str) -> int:
        return ENGINE_FEED_GENERATION

    def heartbeat(self, node_id: str, load: LoadReport) -> bool:
        self._merge.sync(NodeId(node_id))  # liveness is the kvstore's; this is only the feed's tick
        return True

    def apply_kv_events(self, node_id: NodeId, generation: int, events: Sequence[IndexEvent]) -> bool:
        return self._merge.apply(node_id, EventSource.ENGINE, None, events)

    def reset_inventory(self, node_id: NodeId, generation: int) -> bool:
        return self._merge.reset(node_id, EventSource.ENGINE, None)

    def node_lost(self, node_id: str, reason: str, generation: int | None = None) -> bool:
        """The engine died (its cache with it); the node is its kvstore's and stays up."""
        return self._merge.reset(NodeId(node_id), EventSource.ENGINE, None)


class EngineAwareConfirm:
    """A PrefixConfirmer: the kvstore's answer, raised to the engine's own
    prefix at a merged node (an unanswered Lookup stays unanswered: the
    index's figure then stands)."""

    def __init__(self, inner: PrefixConfirmer) -> None:
        self._inner = inner
        self._merge: SourceMerge | None = None
        self._nodes: dict[str, NodeId] = {}  # address -> the merged node registered there

    def bind(self, merge: SourceMerge) -> None:
        """The merge (built on the core, which is built with this confirmer)."""
        self._merge = merge

    def registered(self, node_id: NodeId, address: str) -> None:
        """A node (re-)registered at address (the scheduler's listener tells)."""
        for old in [a for a, n in self._nodes.items() if n == node_id]:
            del self._nodes[old]
        if self._merge is not None and self._merge.merges(node_id):
            self._nodes[address] = node_id

    def asks(self, address: str) -> bool:
        return self._inner.asks(address)

    def confirm(self, address: str, block_hashes: Sequence[int]) -> int | None:
        answer = self._inner.confirm(address, block_hashes)
        node = self._nodes.get(address)
        if answer is None or node is None or self._merge is None:
            return answer
        return max(answer, self._merge.prefix(node, EventSource.ENGINE, block_hashes))
