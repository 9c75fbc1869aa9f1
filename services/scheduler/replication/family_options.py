"""How a family's forecast requests could be served now, and what each
speculative action would add: the planner's inputs, priced in ms (value.py).

Options without any action (`serve_options`):
- every live holder n of the family's prefix (L_n blocks, u_n of them below
  its device tier, d_n of those on its disk tier alone): wait queue_n, the
  disk read of d_n blocks (with a disk model) and the promotion of u_n
  blocks over the host link before prefill, as the router prices a disk
  load, prefill with L_n blocks cached;
- the `spill` least-queued live non-holders, twice each: recomputing the
  whole prompt, and pulling the longest held prefix L* from its best holder
  (the router's pull: link backlog of both ends, then the slower of the wire
  and the source's host link) before a prefill with L* cached; the pulls of
  one source take turns on its link (value.py).
The router picks among exactly these, so a forecast burst spills onto other
nodes as recompute or pulls, and an action is priced against that.

Actions (each an `ActionCandidate` with its new option):
- replicate L* blocks to a non-holder's host or device tier: usable once
  the copy lands (link backlog plus the transfer), then a host copy is
  promoted before prefill like any host hit;
- redundant: the same copy, to the host tier (device tier when the target
  has none), of a prefix with one holder (redundancy.py prices it);
- prefetch a holder's host-only blocks into its device tier: usable once
  promoted (its disk blocks read first, then the host link), then with
  nothing before prefill;
- stage a holder's disk-only blocks into its host tier (issue 44): usable
  once read off the disk (behind the reads already booked on it: the disk
  backlog), a request arriving while it reads waiting for it (joining the
  read, as the kvstore and the simulator do), then with only the host
  link's promotion before prefill; its read delays the disk loads routed to
  that node meanwhile (planner._link_ms). A holder's disk read in every
  option waits for its disk's backlog, or, while a stage of the family is
  in flight there, is that stage. It lands in the host tier, so what it pushes out goes down to the
  disk, not out of the node: each such block x P(reuse) of the host tier
  (reuse_history.py: a reuse that loaded it off the disk counts) x one
  block's disk read.
What an action pushes out of its tier: the blocks beyond that tier's free
pages (capacity minus what the index shows there, minus what this tick
already planned there). Their reuse costs a promotion when the device tier
demotes them to a host tier below, a disk load (one block's read) when the
host tier writes them down to a disk (with a disk model), a recompute (the
family's mean cost per block) otherwise. Pure: reads the view, never changes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from speckv.services.common.engine_profile import EngineProfile, LinkModel
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.orders import ActionKind
from speckv.services.scheduler.replication.value import Demand, ServeOption
from speckv.services.scheduler.views import NodeView


@dataclass(slots=True)
class FamilyState:
    """One forecast family as the planner prices it this tick."""

    family: Family
    demand: Demand
    chain: list[int]  # the longest held prefix, L* blocks
    prompt_tokens: int
    source: NodeId  # the holder a copy of L* comes from
    source_host_only: int  # of L*, blocks the source holds in its host tier alone
    held: dict[NodeId, int]  # holders (and nodes already given the family this tick) -> blocks
    host_only: dict[NodeId, int]  # holders -> blocks of their prefix only below their device tier (host or disk)
    options: list[ServeOption]
    full_ms: float  # prefill without any cache
    hit_ms: float  # prefill with L* cached
    recompute_ms_per_block: float
    chosen: set[tuple[ActionKind, NodeId]] = field(default_factory=set)
    disk_only: dict[NodeId, int] = field(default_factory=dict)  # holders -> of host_only, those only on their disk
    source_disk_only: int = 0  # of source_host_only, blocks the source holds on its disk alone
    disk_wait: dict[NodeId, float] = field(default_factory=dict)  # holders -> ms before a read off their disk starts
    staging: set[NodeId] = field(default_factory=set)  # holders where a stage of this family is in flight


@dataclass(frozen=True, slots=True)
class ActionCandidate:
    kind: ActionKind
    family_index: int
    node: NodeId  # the target of a replica; the holder of a prefetch
    tier: Tier
    blocks: int
    nbytes: int
    option: ServeOption
    transfer_ms: float  # on the network link; a stage's: its read on the node's disk (0: none)


class OptionPricer:
    """The engine, link, host-link and disk cost models the options are
    priced with (disk None: disk blocks priced as host hits, as the router
    prices them without a disk model)."""

    def __init__(self, profile: EngineProfile, link: LinkModel, host_link: LinkModel | None,
                 disk: LinkModel | None = None) -> None:
        self._profile = profile
        self._link = link
        self._host_link = host_link
        self._disk = disk

    @property
    def prices_disk(self) -> bool:
        return self._disk is not None and self._host_link is not None

    @property
    def profile(self) -> EngineProfile:
        return self._profile

    def prefill_ms(self, prompt: int, cached_blocks: int, block_size: int) -> float:
        cached = min(cached_blocks * block_size, prompt - 1)
        return self._profile.prefill_ms(prompt - cached, cached)

    def promote_ms(self, blocks: int, bytes_per_block: int) -> float:
        if blocks <= 0 or self._host_link is None:
            return 0.0
        return self._host_link.transfer_ms(blocks * bytes_per_block)

    def disk_ms(self, blocks: int, bytes_per_block: int) -> float:
        """Reading blocks off a node's disk tier into its host tier (0 without a disk model)."""
        if blocks <= 0 or not self.prices_disk:
            return 0.0
        return self._disk.transfer_ms(blocks * bytes_per_block)  # type: ignore[union-attr]

    def below_ms(self, blocks: int, disk_blocks: int, bytes_per_block: int) -> float:
        """Bringing blocks held below the device tier up to it, disk_blocks of
        them read off the disk first (the router's _below_ms)."""
        if blocks <= 0:
            return 0.0
        return self.promote_ms(blocks, bytes_per_block) + self.disk_ms(disk_blocks, bytes_per_block)

    def holder_below_ms(self, fam: FamilyState, node: NodeId, bytes_per_block: int) -> tuple[float, float]:
        """(wait, ms) of bringing holder node's blocks of the prefix below its
        device tier up: with a disk model its disk read starts once the
        reads booked on its disk are done (wait: fam.disk_wait, ms from
        now), or, while a stage of this family is in flight there, it is
        that stage (wait: at most the same) and ms is the host link's copy
        alone. Without disk blocks or a disk model, wait is 0."""
        up, down = fam.host_only.get(node, 0), fam.disk_only.get(node, 0)
        if not down or not self.prices_disk:
            return 0.0, self.below_ms(up, down, bytes_per_block)
        wait = fam.disk_wait.get(node, 0.0)
        if node in fam.staging:
            return wait, self.promote_ms(up, bytes_per_block)
        return wait, self.below_ms(up, down, bytes_per_block)

    def copy_ms(self, blocks: int, bytes_per_block: int, source_host_only: int, source_disk_only: int = 0) -> float:
        """A copy of blocks off a source holding source_host_only of them
        below its device tier, source_disk_only of those on its disk alone."""
        return max(self._link.transfer_ms(blocks * bytes_per_block),
                   self.below_ms(min(source_host_only, blocks), min(source_disk_only, blocks), bytes_per_block))

    def serve_options(self, fam: FamilyState, live: dict[NodeId, NodeView], queue: dict[NodeId, float],
                      spill: list[NodeId], link_wait: dict[NodeId, float]) -> list[ServeOption]:
        block_size = live[fam.source].block_size
        options = []
        for node, length in fam.held.items():
            view = live[node]
            wait, below = self.holder_below_ms(fam, node, view.bytes_per_block)
            # A request arriving before its disk is free waits for it: ready at wait, joined.
            options.append(ServeOption(node, queue[node], below, self.prefill_ms(fam.prompt_tokens, length, block_size),
                                       ready_ms=wait, joins=wait > 0))
        for node in spill:
            view = live[node]
            options.append(ServeOption(node, queue[node], 0.0, fam.full_ms))
            wait = max(link_wait.get(fam.source, 0.0), link_wait.get(node, 0.0))
            pull = self.copy_ms(len(fam.chain), view.bytes_per_block, fam.source_host_only, fam.source_disk_only)
            options.append(ServeOption(node, queue[node], wait, fam.hit_ms, pull_ms=pull, pull_link=fam.source))
        return options

    def replica(self, fam: FamilyState, index: int, target: NodeView, tier: Tier, queue_ms: float,
                link_wait: dict[NodeId, float], kind: ActionKind = ActionKind.REPLICATE) -> ActionCandidate:
        """A copy of L* to target's tier; kind: REPLICATE or REDUNDANT (the
        same copy, priced on another term: planner.py)."""
        blocks = len(fam.chain)
        nbytes = blocks * target.bytes_per_block
        transfer = self.copy_ms(blocks, target.bytes_per_block, fam.source_host_only, fam.source_disk_only)
        ready = max(link_wait.get(fam.source, 0.0), link_wait.get(target.node_id, 0.0)) + transfer
        before = self.promote_ms(blocks, target.bytes_per_block) if tier is Tier.HOST else 0.0
        option = ServeOption(target.node_id, queue_ms, before, fam.hit_ms, ready_ms=ready)
        return ActionCandidate(kind, index, target.node_id, tier, blocks, nbytes, option, transfer)

    def prefetch(self, fam: FamilyState, index: int, holder: NodeView, queue_ms: float) -> ActionCandidate | None:
        blocks = fam.host_only.get(holder.node_id, 0)
        if blocks <= 0 or self._host_link is None:
            return None
        length = fam.held[holder.node_id]
        wait, below = self.holder_below_ms(fam, holder.node_id, holder.bytes_per_block)
        promote = wait + below
        option = ServeOption(holder.node_id, queue_ms, 0.0,
                             self.prefill_ms(fam.prompt_tokens, length, holder.block_size), ready_ms=promote)
        return ActionCandidate(ActionKind.PREFETCH, index, holder.node_id, Tier.DEVICE, blocks,
                               blocks * holder.bytes_per_block, option, 0.0)

    def stage(self, fam: FamilyState, index: int, holder: NodeView, queue_ms: float,
              disk_wait_ms: float = 0.0) -> ActionCandidate | None:
        """Reading holder's disk-only blocks of its prefix into its host tier:
        ready once the disk read lands, behind the reads already booked on
        the disk (disk_wait_ms); a request arriving before that joins the
        read (waits for it); then it promotes every block below the device
        tier over the host link alone. Its transfer_ms is the read (what it
        holds the disk for: planner._link_ms prices that delay). None when
        the holder has no disk-only block, no disk is priced, or a stage of
        the family is in flight there already."""
        node = holder.node_id
        blocks = fam.disk_only.get(node, 0)
        if blocks <= 0 or not self.prices_disk or node in fam.staging:
            return None
        bpb = holder.bytes_per_block
        read = self.disk_ms(blocks, bpb)
        option = ServeOption(node, queue_ms, self.promote_ms(fam.host_only.get(node, 0), bpb),
                             self.prefill_ms(fam.prompt_tokens, fam.held[node], holder.block_size),
                             ready_ms=disk_wait_ms + read, joins=True)
        return ActionCandidate(ActionKind.STAGE, index, node, Tier.HOST, blocks, blocks * bpb, option, read)

    def miss_ms_per_block(self, fam: FamilyState, node: NodeView, tier: Tier) -> float:
        """What reusing a block this action pushes out of node's tier costs:
        a promotion when it drops to the host tier, a disk load when it drops
        from the host tier to a disk (priced: every host tier has one then),
        else a recompute."""
        if tier is Tier.DEVICE and node.sizes.host_pages > 0 and self._host_link is not None:
            return self.promote_ms(1, node.bytes_per_block)
        if tier is Tier.HOST and self.prices_disk:
            return self.disk_ms(1, node.bytes_per_block)
        return fam.recompute_ms_per_block


def free_pages(node: NodeView, tier: Tier) -> int:
    """Pages of node's tier that hold nothing, as the index sees it."""
    if tier is Tier.HOST:
        return max(0, node.sizes.host_pages - node.host_blocks)
    return max(0, node.sizes.device_pages - node.device_blocks)
