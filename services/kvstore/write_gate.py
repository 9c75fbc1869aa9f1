"""Who may write into this node's reservations: the target half of the data
plane's protection (docs/security.md, "The data plane").

Reserve mints a capability (services/common/capability.py) bound to the
reservation's handle and order, the source node, the reservation's whole
byte range and an expiry `ttl_s` seconds after the Reserve (node clock);
every write path checks it before it touches the reservation:

- the TCP data plane: an AUTH frame carrying the token, once per handle per
  connection, before any CHUNK or END of that handle (receiver.py);
- WriteChunks, Commit and Abort: the request's `capability` field.

A refused write changes nothing: the check runs before the store is asked
for anything, so no reservation is aborted or freed on a bad token (an
attacker cannot make a node drop someone else's transfer by presenting
rubbish). Thread-safe: the key is immutable and the clock is read-only.
"""
from __future__ import annotations

from speckv.services.common.capability import Capability, CapabilityKey
from speckv.services.common.clock import Clock
from speckv.services.common.errors import PermissionDenied
from speckv.services.kvstore.reservations import Grant


class WriteGate:
    """Mints and checks this node's write capabilities. ttl_s: how long a
    capability stays valid after its Reserve, seconds (the reservation's own
    lease ends it sooner when no byte arrives)."""

    def __init__(self, node_id: str, clock: Clock, ttl_s: float, key: CapabilityKey | None = None) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s={ttl_s}: must be > 0")
        self._node_id = node_id
        self._clock = clock
        self._key = key or CapabilityKey()
        self.ttl_s = ttl_s

    def mint(self, grant: Grant, order_id: str, source_node: str) -> bytes:
        total = len(grant.hashes) * grant.bytes_per_block
        return self._key.sign(Capability(grant.handle, order_id, source_node, self._node_id, 0, total,
                                         self._clock.now() + self.ttl_s))

    def secret(self, token: bytes) -> bytes:
        """The secret of a token this gate minted (send it only over the
        control plane: ReserveResponse.capability_secret)."""
        return self._key.secret(token)

    def check(self, token: bytes, handle: str, offset: int = 0, size: int = 0) -> Capability:
        """The capability token proves for [offset, offset+size) of handle;
        PermissionDenied otherwise."""
        return self._key.verify(token, self._clock.now(), handle=handle, offset=offset, size=size)

    def still_covers(self, capability: Capability, handle: str, offset: int, size: int) -> None:
        """Re-checks an already verified capability for one more chunk
        (expiry and range; no MAC to recompute)."""
        now = self._clock.now()
        if now >= capability.expires_s:
            raise PermissionDenied(f"reservation {handle}: write capability expired at "
                                   f"{capability.expires_s:.3f} (now {now:.3f})")
        if not capability.covers(offset, size):
            raise PermissionDenied(f"reservation {handle}: bytes {offset}+{size} outside the capability's "
                                   f"{capability.lo}..{capability.hi}")
