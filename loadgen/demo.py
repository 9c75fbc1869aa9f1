"""`speckv demo`: start a local cluster, replay a slice of a real trace from
the traces directory, and print what happened (routes, prefix reuse, blocks
per node, the scheduler's view). The per-policy comparison with emulated
engines and TTFT comes with the end-to-end issue; this is its first stage.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import grpc
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from speckv.loadgen.replay import Replayer, RequestOutcome
from speckv.loadgen.traces import load_mooncake, resolve_traces_dir
from speckv.loadgen.traces.mooncake import MOONCAKE_BLOCK_TOKENS
from speckv.services.cluster.launcher import ClusterSpec, LocalCluster
from speckv.services.cluster.status import cluster_tables, wide_console
from speckv.services.common.errors import InvalidArgument, NotFound
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speckv demo", description=__doc__)
    parser.add_argument("--traces", default=None, help="traces directory [env SPECKV_TRACES; ../shared/traces]")
    parser.add_argument("--trace", default="mooncake_conversation_trace.jsonl", help="file in the traces directory")
    parser.add_argument("--start-s", type=float, default=0.0, help="slice start, trace seconds")
    parser.add_argument("--duration-s", type=float, default=90.0, help="slice length, trace seconds")
    parser.add_argument("--speed", type=float, default=6.0, help="time compression (6 = six times faster)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--num-pages", type=int, default=4096, help="pool pages per node")
    parser.add_argument("--json", default=None, help="write the summary as JSON here")
    args = parser.parse_args(list(argv))
    if args.speed <= 0 or args.duration_s <= 0:
        raise InvalidArgument("--speed and --duration-s must be > 0")
    return args


def summarize(outcomes: Sequence[RequestOutcome]) -> dict[str, float]:
    done = [o for o in outcomes if not o.error]
    ttft = sorted(o.expected_ttft_ms for o in done) or [0.0]
    prompt = sum(o.prompt_tokens for o in done) or 1
    return {
        "requests": len(outcomes),
        "errors": len(outcomes) - len(done),
        "prefix_hit_ratio": sum(o.cached_tokens for o in done) / prompt,
        "blocks_stored": sum(o.blocks_stored for o in done),
        "expected_ttft_p50_ms": statistics.median(ttft),
        "expected_ttft_p99_ms": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
        "route_p50_ms": statistics.median([o.route_latency_ms for o in done] or [0.0]),
    }


def summary_table(summary: dict[str, float], per_node: dict[str, int]) -> Table:
    table = Table(title="replay summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    for node, count in sorted(per_node.items()):
        table.add_row(f"requests routed to {node}", str(count))
    return table


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parse_args(argv)
    trace_path = resolve_traces_dir(args.traces, environ) / args.trace
    if not trace_path.exists():
        raise NotFound(f"trace {trace_path} not found")
    requests = load_mooncake(trace_path, args.start_s, args.duration_s)
    console = wide_console()
    console.print(f"trace {trace_path.name}: {len(requests)} requests in [{args.start_s}, "
                  f"{args.start_s + args.duration_s}) s, replayed {args.speed}x faster on {args.nodes} nodes")
    spec = ClusterSpec(nodes=args.nodes, block_size=MOONCAKE_BLOCK_TOKENS, num_pages=args.num_pages)
    with tempfile.TemporaryDirectory(prefix="speckv-demo-") as run_dir, \
            LocalCluster(spec, Path(run_dir), environ) as cluster:
        nodes = cluster.node_addresses()
        bytes_per_block = _bytes_per_block(next(iter(nodes.values())))
        replayer = Replayer(cluster.scheduler_address, nodes, bytes_per_block)
        try:
            outcomes = _replay_with_progress(replayer, requests, args.speed, console)
        finally:
            replayer.close()
        summary = summarize(outcomes)
        per_node: dict[str, int] = {}
        for o in outcomes:
            if o.node_id:
                per_node[o.node_id] = per_node.get(o.node_id, 0) + 1
        console.print(summary_table(summary, per_node))
        with grpc.insecure_channel(cluster.scheduler_address) as channel:
            state = scheduler_pb2_grpc.SchedulerStub(channel).GetClusterState(
                scheduler_pb2.ClusterStateRequest(), timeout=5.0)
        for table in cluster_tables(state):
            console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"trace": trace_path.name, **summary, "per_node": per_node}, indent=2))
        console.print(f"summary written to {args.json}")
    return 1 if summary["errors"] else 0


def _bytes_per_block(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stats = kvstore_pb2_grpc.KVStoreStub(channel).GetStats(kvstore_pb2.StatsRequest(), timeout=5.0)
    return stats.geometry.bytes_per_block


def _replay_with_progress(replayer: Replayer, requests, speed: float, console) -> list[RequestOutcome]:
    columns = (TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("replay", total=len(requests), status="")
        errors = 0

        def done(outcome: RequestOutcome) -> None:
            nonlocal errors
            errors += bool(outcome.error)
            progress.update(task, advance=1, status=f"errors {errors}" if errors else "")

        return replayer.replay(requests, speed, done)
