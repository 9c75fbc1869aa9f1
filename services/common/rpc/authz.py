"""Who may make which call: one rule per kind of caller, from the identity
the caller's certificate proves (tls.peer_identity). Servicers call these
first thing in a guarded method; the interceptor maps the errors.

Checks are on exactly when the call came over TLS (tls.py's invariant: a
server is TLS or plaintext, never both), so a server without --tls-* flags
behaves as before. The rules (docs/security.md):

- require_node: only the node itself (RegisterNode, Heartbeat).
- require_node_or_admin: the node, or an admin (WatchOrders, a
  ReportOrderStatus from anyone but the order's source node).
- require_admin: an operator (SetPolicy, SubmitOrder, ReloadModel).
- require_admin_or_target_engine: KVStore.Replicate, an operator's, or a
  pull: the order's target node's engine (its connector's certificate)
  asking for a copy into its own kvstore, which the Replicator then sends
  only to that node's registered address. A node's kvstore certificate may
  not: peers never read blocks, and a pull is the engine's.
- require_service_or_admin: another process of one service (a scheduler
  replica's ShareRoutes: only scheduler replicas, spiffe://speckv/service/
  scheduler) or an admin.
- require_engine_or_admin: the node's own engine (the connector's
  certificate, spiffe://speckv/engine/<node>) or an admin: a node's blocks
  are written and read only by them (PutBlocks, GetBlocks, MapBlocks); peers
  write replicas through Reserve and its capability, never PutBlocks.

Everything else needs only a certificate the cluster's CA signed, which the
TLS handshake already demands.
"""
from __future__ import annotations

import grpc

from speckv.services.common.errors import PermissionDenied
from speckv.services.common.rpc.tls import ADMIN, Identity, Role, peer_identity


def enforced(context: grpc.ServicerContext) -> bool:
    """The call came over TLS, so its caller's identity is checked."""
    return peer_identity(context) is not None


def require_admin(context: grpc.ServicerContext, call: str) -> None:
    caller = peer_identity(context)
    if caller is not None and caller != ADMIN:
        raise PermissionDenied(f"{call}: {caller} may not; it needs the admin identity {ADMIN.uri}")


def require_admin_or_target_engine(context: grpc.ServicerContext, target_node: str, call: str) -> bool:
    """Whether the caller is the admin (True) or the target node's engine
    (False); PermissionDenied for anyone else. Plaintext: True."""
    caller = peer_identity(context)
    if caller is None or caller == ADMIN:
        return True
    if target_node and caller == Identity(Role.ENGINE, target_node):
        return False
    raise PermissionDenied(f"{call} to node {target_node!r}: {caller} may not; only the admin ({ADMIN.uri}) or "
                           f"that node's engine ({Identity(Role.ENGINE, target_node).uri}: a pull into it) may")


def require_node(context: grpc.ServicerContext, node_id: str, call: str) -> None:
    caller = peer_identity(context)
    if caller is not None and caller != Identity(Role.NODE, node_id):
        raise PermissionDenied(f"{call} for node {node_id!r}: {caller} may not; only that node's "
                               "certificate may")


def require_node_or_admin(context: grpc.ServicerContext, node_id: str, call: str) -> None:
    caller = peer_identity(context)
    if caller is not None and caller not in (ADMIN, Identity(Role.NODE, node_id)):
        raise PermissionDenied(f"{call} for node {node_id!r}: {caller} may not; only that node or the admin "
                               f"({ADMIN.uri}) may")


def require_engine_or_admin(context: grpc.ServicerContext, node_id: str, call: str) -> None:
    caller = peer_identity(context)
    if caller is not None and caller not in (ADMIN, Identity(Role.ENGINE, node_id)):
        raise PermissionDenied(f"{call} on node {node_id!r}: {caller} may not; only that node's engine "
                               f"({Identity(Role.ENGINE, node_id).uri}) or the admin may")


def require_service_or_admin(context: grpc.ServicerContext, service: str, call: str) -> None:
    caller = peer_identity(context)
    if caller is not None and caller not in (ADMIN, Identity(Role.SERVICE, service)):
        raise PermissionDenied(f"{call}: {caller} may not; only the {service} service "
                               f"({Identity(Role.SERVICE, service).uri}) or the admin may")
