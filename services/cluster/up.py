"""`speckv up`: run the local cluster in the foreground until Ctrl-C or SIGTERM,
serving `speckv node add/remove` on its control socket (control.py). With
`--engine vllm --model DIR`, also one vLLM OpenAI server per node beside its
kvstore, SpeckvConnector loaded (vllm_servers.py); the kvstores take the
model's KV geometry from its config.json, and the scheduler indexes each
engine's own KV events beside its kvstore's (--kv-events NODE=...,kvstore=1,
under the connector's layout digest), so Route sees the engines' prefix
caches as well as the kvstores' tiers, and probes each engine's /health
(health=), so an engine that dies drops out of the index while its kvstore
lives on."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Mapping, Sequence

from rich.table import Table

from speckv.services.cluster.control import ControlServer
from speckv.services.cluster.launcher import ClusterSpec, LocalCluster, ServiceProcess, default_run_dir
from speckv.services.cluster.status import wide_console
from speckv.services.cluster.vllm_servers import (
    VllmServerSpec, kvstore_geometry_args, model_geometry, start_servers, stop_server)
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import InvalidArgument
from speckv.services.engine.vllm_connector.identity import cpu_layout
from speckv.services.common.node_sizes import NodeSizes


VLLM_PROFILE = "tiny-llama-vllm-cpu"  # the CPU build's profile (its source: services/config/engine_profiles.json)
EVENTS_PORT_OFFSET = 100  # node-i's engine publishes its KV events on --vllm-port-base + this + i


def services_table(services: Sequence[ServiceProcess]) -> Table:
    table = Table(title="speckv local cluster")
    for column in ("service", "kind", "address", "pid", "log"):
        table.add_column(column)
    for s in services:
        table.add_row(s.name, s.kind, s.address, str(s.pid), s.log_path)
    return table


def parse_spec(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[ClusterSpec, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="speckv up", description="Start the local cluster.")
    parser.add_argument("--nodes", type=int, default=3, help="kvstore nodes (default 3)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--geometry", default="tiny", help="KV geometry preset of every node")
    parser.add_argument("--block-size", type=int, default=0, help="tokens per block; 0 = preset's")
    parser.add_argument("--device-pages", type=int, default=4096, help="device-tier blocks per node")
    parser.add_argument("--host-pages", type=int, default=0, help="host-tier blocks per node (0: no host tier)")
    parser.add_argument("--policy", default="none", help="replication policy of the scheduler")
    parser.add_argument("--replicas", type=int, default=1,
                        help="scheduler replicas: >1 also starts a one-member etcd where they elect the one that "
                             "plans (docs/replicas.md); every replica answers Route")
    parser.add_argument("--run-dir", default=None, help="logs and cluster.json [env SPECKV_RUN_DIR]")
    parser.add_argument("--metrics-port-base", type=int, default=0,
                        help="serve Prometheus /metrics per service: predictor on this port, scheduler +1, "
                             "node-i +2+i (0: none, the default)")
    parser.add_argument("--tls", action="store_true",
                        help="mutual TLS everywhere: a throwaway CA and per-service certificates in RUN_DIR/tls "
                             "(docs/security.md)")
    parser.add_argument("--engine", choices=("none", "vllm"), default="none",
                        help="vllm: one vLLM OpenAI server per node beside its kvstore, with SpeckvConnector "
                             "(needs --model; vLLM installed: make venv)")
    parser.add_argument("--model", type=Path, default=None, help="the engines' model directory (with --engine vllm)")
    parser.add_argument("--vllm-port-base", type=int, default=8100,
                        help="node-i's vLLM server listens on this + i, and publishes its KV events on this + 100 + i")
    parser.add_argument("--engine-profile", default="",
                        help="the scheduler's prefill profile (services/config/engine_profiles.json); default: "
                             f"{VLLM_PROFILE} with --engine vllm (its block size must be the engines'), else the "
                             "scheduler's own default")
    args = parser.parse_args(list(argv))
    if not 1 <= args.nodes <= 64:
        raise InvalidArgument(f"--nodes={args.nodes}: must be 1..64 on one machine")
    if not 1 <= args.replicas <= 7:
        raise InvalidArgument(f"--replicas={args.replicas}: must be 1..7")
    extra: dict[str, list[str]] = {}
    if args.engine == "vllm":
        if args.model is None:
            raise InvalidArgument("--engine vllm needs --model DIR (a local model directory)")
        extra["kvstore"] = kvstore_geometry_args(args.model, "float32", args.block_size or 32)
        extra["scheduler"] = ["--engine-profile", engine_profile(args), "--kv-events", engine_events(args)]
    elif args.engine_profile:
        extra["scheduler"] = ["--engine-profile", args.engine_profile]
    spec = ClusterSpec(nodes=args.nodes, host=args.host, geometry=args.geometry, block_size=args.block_size,
                       sizes=NodeSizes(args.device_pages, args.host_pages), policy=args.policy,
                       metrics_port_base=args.metrics_port_base, tls=args.tls, extra_args=extra,
                       replicas=args.replicas)
    return spec, args


def engine_profile(args: argparse.Namespace) -> str:
    """The scheduler's profile with vLLM engines: its block size must be theirs,
    or the scheduler refuses every event of theirs (InvalidArgument here)."""
    name = args.engine_profile or VLLM_PROFILE
    block_size = get_profile(name).geometry.block_size
    if block_size != (args.block_size or 32):
        raise InvalidArgument(f"--engine-profile {name}: its block size is {block_size} tokens, the engines' "
                              f"{args.block_size or 32} (--block-size)")
    return name


def node_index(node: str) -> int:
    """i of node-i (the cluster's node names): its engine's ports are counted from it."""
    return int(node.rsplit("-", 1)[1])


def engine_url(args: argparse.Namespace, index: int) -> str:
    """Node index's vLLM OpenAI server."""
    return f"http://{args.host}:{args.vllm_port_base + index}"


def events_endpoint(args: argparse.Namespace, index: int, bind: bool) -> str:
    """Node index's engine publishes its KV events here (bind: as vLLM binds it)."""
    return f"tcp://{'*' if bind else args.host}:{args.vllm_port_base + EVENTS_PORT_OFFSET + index}"


def engine_events(args: argparse.Namespace) -> str:
    """The scheduler's --kv-events: every node's engine, a second source beside
    its kvstore, under the digest its connector names blocks by (the model as
    vLLM has it, the kvstores' geometry), probed at its server's /health."""
    geometry = model_geometry(args.model, "float32", args.block_size or 32)
    digest = cpu_layout(str(args.model), geometry).digest().hex()
    return ";".join(f"node-{i}={events_endpoint(args, i, bind=False)},digest={digest},kvstore=1,"
                    f"health={engine_url(args, i)}/health" for i in range(args.nodes))


def start_engines(cluster: LocalCluster, args: argparse.Namespace, run_dir: Path,
                  environ: Mapping[str, str]) -> list[tuple[VllmServerSpec, subprocess.Popen]]:
    """One vLLM server per node, each bound to its own core, healthy before this returns."""
    cores = os.cpu_count() or 1
    specs = []
    addresses = sorted(cluster.node_addresses().items())
    for node, address in addresses:
        i = node_index(node)  # not the position in the sorted names: node-10 sorts before node-2
        tls = cluster.certs.engine(node) if cluster.certs is not None else None
        specs.append(VllmServerSpec(f"vllm-{node}", str(args.model), args.vllm_port_base + i, address,
                                    host=args.host, block_size=args.block_size or 32, core=i % cores, tls=tls,
                                    node_id=node, peers=tuple((n, a) for n, a in addresses if n != node),
                                    kv_events_endpoint=events_endpoint(args, i, bind=True)))
    return start_servers(specs, run_dir, environ)


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    spec, args = parse_spec(argv, environ)
    run_dir = default_run_dir(environ) if args.run_dir is None else Path(args.run_dir)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    cluster = LocalCluster(spec, run_dir, environ)
    console = wide_console()
    control: ControlServer | None = None
    engines: list[tuple[VllmServerSpec, subprocess.Popen]] = []
    try:
        services = cluster.start()
        control = ControlServer(cluster).start()
        console.print(services_table(services))
        console.print(f"scheduler: {', '.join(cluster.scheduler_addresses().values())}   "
                      f"(speckv status --run-dir {run_dir})")
        if cluster.etcd_endpoint:
            console.print(f"etcd: {cluster.etcd_endpoint} (the replicas' election and shared state)")
        if cluster.certs is not None:
            admin = cluster.certs.admin
            console.print(f"mutual TLS; admin identity: --tls-cert {admin.cert} --tls-key {admin.key} "
                          f"--tls-ca {admin.ca}")
        console.print(f"membership: speckv node add | speckv node remove NODE   (--run-dir {run_dir}; "
                      f"socket {control.path})")
        if args.engine == "vllm":
            engines = start_engines(cluster, args, run_dir, environ)
            for engine, _ in engines:
                console.print(f"{engine.name}: {engine.url}/v1 (OpenAI API, model {engine.served_model_name!r}; "
                              f"kvstore {engine.kvstore})")
        print("ready; Ctrl-C or SIGTERM stops every service", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        for _, popen in engines:
            stop_server(popen)
        if control is not None:
            control.stop()
        cluster.stop()
        print("stopped", flush=True)
    return 0
