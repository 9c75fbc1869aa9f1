"""`speckv node add` / `speckv node remove NODE`: change a running `speckv
up` cluster's membership through its control socket (control.py)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Mapping, Sequence

from speckv.services.cluster.control import SOCKET_NAME, request
from speckv.services.cluster.launcher import default_run_dir
from speckv.services.common.errors import FailedPrecondition


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speckv node", description=__doc__)
    parser.add_argument("--run-dir", default=None, help="the cluster's run directory [env SPECKV_RUN_DIR]")
    commands = parser.add_subparsers(dest="op", required=True)
    commands.add_parser("add", help="start one more node (kvstore) that registers with the running scheduler")
    remove = commands.add_parser("remove", help="stop a node; the scheduler declares it down at once")
    remove.add_argument("node", help="its id, e.g. node-1 (speckv status lists them)")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parse_args(argv)
    run_dir = default_run_dir(environ) if args.run_dir is None else Path(args.run_dir)
    message: dict[str, object] = {"op": args.op, **({"node": args.node} if args.op == "remove" else {})}
    reply = request(run_dir / SOCKET_NAME, message)
    if not reply.get("ok"):
        raise FailedPrecondition(f"node {args.op}: {reply.get('error')}")
    node = reply["node"]
    assert isinstance(node, dict)
    verb = "added" if args.op == "add" else "removed"
    print(f"{node['name']} {verb} ({node['address']}, pid {node['pid']}, log {node['log_path']})")
    print(json.dumps(node))
    return 0
