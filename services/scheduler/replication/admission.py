"""What an order must satisfy against its target node before the scheduler
issues it, and the defaults it gets there (SchedulerCore._submit_locked runs
this after validate_spec and the liveness of both nodes).

- The host tier is named only on a node that has one.
- A prefetch promotes host-tier blocks into the device tier: its target has
  a host tier and the order names the device tier or none.
- A stage reads disk-only blocks into the host tier: its target has a
  host tier and the order names the host tier or none.
- A retain protects the target's last tier (host if it has one, else
  device): the order names that tier or none.
Defaults: the target's address, the family of the chain's first block, the
policy "manual", and the tier the action lands in (the target's host tier
when it has one, except for a prefetch, which lands in the device tier).
A stage's target must have a disk tier too, which the scheduler does not
know from the registration: a node without one finds nothing to stage and
commits 0 blocks.
"""
from __future__ import annotations

from dataclasses import replace

from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.common.ids import default_family
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.cluster import Node
from speckv.services.scheduler.orders import ActionKind, OrderSpec


def admitted(spec: OrderSpec, target: Node) -> OrderSpec:
    """spec with its defaults filled in; InvalidArgument or
    FailedPrecondition when it does not fit target's tiers."""
    if spec.tier is Tier.DISK:
        raise InvalidArgument("an order cannot target the disk tier (STORAGE): blocks reach it only by eviction "
                              "from the host tier; target_medium must be GPU, CPU or empty")
    if spec.tier is Tier.HOST and not target.sizes.host_pages:
        raise FailedPrecondition(f"order names the host tier of node {target.node_id!r}, which has none")
    if spec.action is ActionKind.PREFETCH and spec.tier is Tier.HOST:
        raise InvalidArgument("a prefetch promotes into the device tier: its target_medium must be GPU or empty")
    if spec.action is ActionKind.STAGE and spec.tier is Tier.DEVICE:
        raise InvalidArgument("a stage reads disk blocks into the host tier: its target_medium must be CPU or empty")
    if spec.action is ActionKind.STAGE and not target.sizes.host_pages:
        raise FailedPrecondition(f"a stage reads disk blocks into the host tier; node {target.node_id!r} has none")
    host = target.sizes.host_pages
    if spec.action is ActionKind.RETAIN and spec.tier is not None and spec.tier is not (
            Tier.HOST if host else Tier.DEVICE):
        raise InvalidArgument(f"a retain protects node {target.node_id!r}'s last tier "
                              f"({'CPU' if host else 'GPU'}): its target_medium must be that or empty")
    if spec.action is ActionKind.PREFETCH and not target.sizes.host_pages:
        raise FailedPrecondition(f"a prefetch promotes host-tier blocks; node {target.node_id!r} has no host tier")
    return replace(spec, block_hashes=list(spec.block_hashes),
                   target_address=spec.target_address or target.address,
                   family=spec.family or default_family(spec.block_hashes),
                   policy=spec.policy or "manual",
                   tier=spec.tier or (Tier.HOST if target.sizes.host_pages and spec.action is not ActionKind.PREFETCH
                                      else Tier.DEVICE))
