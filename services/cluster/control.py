"""The control path of a running `speckv up` (issue 27): operators add and
remove nodes at runtime with `speckv node add` / `speckv node remove NODE`.

`speckv up` listens on a Unix socket in its run directory
(`<run_dir>/control.sock`, mode 0600: only its user can reach it) and
names it in cluster.json. One request per connection, one JSON line each
way: {"op": "add"} or {"op": "remove", "node": "node-1"}; the answer is
{"ok": true, "node": {...ServiceProcess}} or {"ok": false, "error": "..."}.
Requests run one at a time.

- add: LocalCluster.add_node: a kvstore node with the next free id (with
  TLS a certificate from the cluster's CA) that registers with the running
  scheduler; answered once the scheduler counts it alive.
- remove: SIGTERM to the node's kvstore (SIGKILL after its grace period).
  Its event stream closes and the reconnect is refused, so the scheduler
  declares it down at once (event_sync.py), as it would after the heartbeat
  timeout anyway; answered once the scheduler no longer counts it alive.
  No admin RPC is needed: a node that is gone is what the scheduler must
  handle in any case, and the operator's path exercises it.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
import time
from dataclasses import asdict
from pathlib import Path

from speckv.services.cluster.launcher import LocalCluster
from speckv.services.common.errors import InvalidArgument, SpeckvError, Unavailable
from speckv.services.common.rpc.tls import dial
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)
SOCKET_NAME = "control.sock"
MAX_REQUEST_BYTES = 4096
REMOVE_WAIT_S = 30.0  # how long `remove` waits for the scheduler to count the node down


class ControlServer:
    """Serves add/remove for one LocalCluster on its run directory's socket."""

    def __init__(self, cluster: LocalCluster, path: Path | None = None) -> None:
        self.cluster = cluster
        self.path = path or cluster.run_dir / SOCKET_NAME
        self._lock = threading.Lock()  # one membership change at a time
        self._server: socketserver.UnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "ControlServer":
        self.path.unlink(missing_ok=True)
        control = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(MAX_REQUEST_BYTES)
                self.wfile.write((json.dumps(control.answer(line)) + "\n").encode())

        old_mask = os.umask(0o177)  # the socket is created 0600
        try:
            self._server = socketserver.UnixStreamServer(str(self.path), Handler)
        finally:
            os.umask(old_mask)
        self._thread = threading.Thread(target=self._server.serve_forever, name="cluster-control", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.path.unlink(missing_ok=True)

    def answer(self, line: bytes) -> dict[str, object]:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise InvalidArgument("a request is a JSON object")
            with self._lock:
                return {"ok": True, "node": asdict(self._run(request))}
        except (ValueError, SpeckvError) as exc:
            return {"ok": False, "error": str(exc)}

    def _run(self, request: dict[str, object]):
        op = request.get("op")
        if op == "add":
            service = self.cluster.add_node()
            log.info("node %s added at %s", service.name, service.address)
            return service
        if op == "remove":
            node = request.get("node")
            if not isinstance(node, str) or not node:
                raise InvalidArgument("remove needs a node id")
            service = self.cluster.remove_node(node)
            _wait_down(self.cluster, node)
            log.info("node %s removed", node)
            return service
        raise InvalidArgument(f"op={op!r}: expected add or remove")


def _wait_down(cluster: LocalCluster, node: str) -> None:
    deadline = time.monotonic() + REMOVE_WAIT_S
    with dial(cluster.scheduler_address, cluster.admin_tls, "scheduler") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        while True:
            state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=2.0)
            if not any(n.node_id == node and n.alive for n in state.nodes):
                return
            if time.monotonic() > deadline:
                raise Unavailable(f"node {node} stopped but the scheduler still counts it alive")
            time.sleep(0.05)


def request(path: Path, message: dict[str, object], timeout_s: float = 120.0) -> dict[str, object]:
    """One request to a running `speckv up`'s control socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        try:
            conn.connect(str(path))
        except OSError as exc:
            raise Unavailable(f"no running `speckv up` answers on {path} ({exc.strerror or exc})") from None
        conn.sendall((json.dumps(message) + "\n").encode())
        with conn.makefile("rb") as reader:
            line = reader.readline()
    if not line:
        raise Unavailable(f"{path}: the cluster closed the connection without an answer")
    return json.loads(line)
