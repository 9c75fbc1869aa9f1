"""`speckv status`: the scheduler's view of the cluster as a table."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Mapping, Sequence

import grpc
from rich.console import Console
from rich.table import Table

from speckv.services.cluster.launcher import default_run_dir
from speckv.services.common.config import add_config_arguments, config_from
from speckv.services.common.errors import NotFound, Unavailable
from speckv.services.common.rpc.tls import ClientTlsSettings, TlsFiles, TlsMaterial, dial
from speckv.services.scheduler.adapters.outcomes_proto import action_stats_from_proto
from speckv.services.scheduler.replication.outcomes import OUTCOME_NAMES
from speckv.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc


def scheduler_address(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """--scheduler, else SPECKV_SCHEDULER, else the running local cluster's."""
    if args.scheduler:
        return args.scheduler
    if environ.get("SPECKV_SCHEDULER"):
        return environ["SPECKV_SCHEDULER"]
    state = Path(args.run_dir or default_run_dir(environ)) / "cluster.json"
    if not state.exists():
        raise NotFound(f"no local cluster found at {state}; start one with `speckv up` or pass --scheduler")
    return json.loads(state.read_text())["scheduler"]


def client_tls(args: argparse.Namespace, environ: Mapping[str, str]) -> TlsMaterial | None:
    """--tls-* (or SPECKV_TLS_*), else the admin files a local `speckv up --tls`
    cluster named in its cluster.json, else None (plaintext)."""
    settings = config_from(ClientTlsSettings, args, environ)
    if settings.files() is not None:
        return settings.load()
    if args.scheduler or environ.get("SPECKV_SCHEDULER"):
        return None
    state = Path(args.run_dir or default_run_dir(environ)) / "cluster.json"
    admin = json.loads(state.read_text()).get("admin_tls") if state.exists() else None
    return TlsFiles(**admin).load() if admin else None


def cluster_tables(state: scheduler_pb2.ClusterState) -> list[Table]:
    nodes = Table(title=f"nodes (policy: {state.policy}, families: {state.num_families}{_leadership(state)})")
    for column in ("node", "address", "alive", "device pages avail/cap", "host blocks/cap", "retained/cap",
                   "queued tok", "running tok", "blocks", "heartbeat age s", "routes"):
        nodes.add_column(column)
    for n in state.nodes:
        host = f"{n.host_blocks}/{n.host_pages}" if n.host_pages else "-"
        retained = str(n.retained_blocks) if n.HasField("retained_blocks") else "-"
        retain_cap = f"{retained}/{n.retain_max_blocks}" if n.HasField("retain_max_blocks") else "-"
        nodes.add_row(n.node_id, n.address, "yes" if n.alive else "DOWN", f"{n.free_pages}/{n.capacity_pages}",
                      host, retain_cap, str(n.queued_tokens), str(n.running_tokens), str(n.num_blocks),
                      f"{n.last_heartbeat_age_s:.1f}", str(n.routes_total))
    orders = Table(title="replication orders")
    orders.add_column("state")
    orders.add_column("count")
    for o in state.orders:
        orders.add_row(common_pb2.OrderState.Name(o.state).removeprefix("ORDER_STATE_").lower(), str(o.count))
    return [nodes, orders] + ([actions_table(state.actions)] if state.actions else []) \
        + ([transports_table(state.transports)] if state.transports else [])


def _leadership(state: scheduler_pb2.ClusterState) -> str:
    """', leader: ID (epoch E; this replica)' with replicas; '' for a single scheduler (no leader id)."""
    lead = state.leadership
    if not lead.leader_id:
        return "" if lead.answering_is_leader or not state.HasField("leadership") else ", leader: none now"
    who = "this replica" if lead.answering_is_leader else f"at {lead.leader_address}"
    return f", leader: {lead.leader_id} (epoch {lead.epoch}; {who})"


def transports_table(rows: Sequence[scheduler_pb2.TransportStats]) -> Table:
    """Per source, target and data plane: the copies it carried and their GiB
    (committed orders, kept in the scheduler's state across restarts)."""
    table = Table(title="committed copies by transport")
    for column in ("source", "target", "transport", "orders", "GiB"):
        table.add_column(column)
    for r in rows:
        table.add_row(r.source_node, r.target_node, r.transport or "(not reported)", str(r.orders),
                      f"{r.bytes / 2**30:.2f}")
    return table


def actions_table(actions: Sequence[scheduler_pb2.ActionOutcomeStats]) -> Table:
    """Per policy, action and the forecast its orders were bought for: the
    orders, their GiB, what they came to (pending: no outcome yet) and the
    share of the decided bytes read in the lease and after it."""
    table = Table(title="speculative actions since the scheduler started")
    for column in ("policy", "action", "forecast", "orders", "GiB", *(o.replace("_", " ") for o in OUTCOME_NAMES),
                   "pending", "bytes read in time", "read after lease"):
        table.add_column(column)
    for a in actions:
        for part in a.by_forecast or [a]:
            stats = action_stats_from_proto(part)
            table.add_row(a.policy, a.action, part.forecast or "none", str(stats.orders), f"{stats.bytes / 2**30:.2f}",
                          *(str(stats.outcomes.get(o, 0)) for o in OUTCOME_NAMES),
                          str(stats.pending_orders),
                          _share(stats.bytes_used_in_time_share), _share(stats.bytes_read_after_lease_share))
    return table


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    parser = argparse.ArgumentParser(prog="speckv status", description="Print the scheduler's cluster state.")
    parser.add_argument("--scheduler", default=None, help="scheduler address host:port [env SPECKV_SCHEDULER]")
    parser.add_argument("--run-dir", default=None, help="local cluster run dir [env SPECKV_RUN_DIR]")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_config_arguments(parser, ClientTlsSettings)
    args = parser.parse_args(list(argv))
    address = scheduler_address(args, environ)
    with dial(address, client_tls(args, environ), "scheduler") as channel:
        try:
            state = scheduler_pb2_grpc.SchedulerStub(channel).GetClusterState(
                scheduler_pb2.ClusterStateRequest(), timeout=5.0)
        except grpc.RpcError as exc:
            raise Unavailable(f"scheduler at {address}: {exc.code().name}: {exc.details()}") from None
    if args.json:
        from google.protobuf.json_format import MessageToJson

        print(MessageToJson(state))
        return 0
    console = wide_console()
    for table in cluster_tables(state):
        console.print(table)
    return 0


def wide_console() -> Console:
    """A console that does not squeeze tables into 80 columns when stdout is
    a pipe or a log file (make, CI, docker logs)."""
    console = Console()
    return console if console.is_terminal else Console(width=160)
