"""An OpenSharedPools answer read as the pools a peer of this process may
map (shm/): for both same-host writers and readers that speak gRPC, the
kvstore's shm_target.py and the vLLM connector's shared_client.py."""
from __future__ import annotations

from speckv.services.kvstore.shm.arena import ArenaAddress, HostIdentity
from speckv.services.kvstore.shm.mapped_pool import SharedPoolInfo
from speckv.v1 import kvstore_pb2


def offered_pools(reply: kvstore_pb2.OpenSharedPoolsResponse) -> tuple[list[SharedPoolInfo], str]:
    """The pools this process may map, or none and why ("shares no pool",
    "on another host"); the why is "" when there are some."""
    if not reply.pools:
        return [], "shares no pool"
    host = HostIdentity(reply.boot_id, reply.pid_namespace)
    if not HostIdentity.here().shares_memory_with(host):
        return [], "on another host"
    return [SharedPoolInfo(p.medium, ArenaAddress(p.pid, p.fd, p.size, p.token, host), p.num_pages)
            for p in reply.pools], ""
