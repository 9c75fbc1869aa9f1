"""The `speckv` command: one entry point for every service and tool.

    speckv kvstore|predictor|scheduler [flags]   run one service process
    speckv up --nodes N [--tls]                  the local cluster
    speckv certs --out DIR --nodes a,b           a local CA and mutual-TLS certificates
    speckv status                                the scheduler's cluster state
    speckv node add | remove NODE                a running cluster's membership
    speckv demo                                  replay a trace slice on a local cluster

The service commands run from the lean install (`pip install speckv`); the lab
commands (LAB: load generator, simulator, benches, experiments, demo) need the
`lab` extra's dependencies too. Every command's module is imported only when
that command runs, so a service process never loads the lab's.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from typing import Mapping, Sequence

from speckv.services.common.errors import SpeckvError
from speckv.services.cluster.parent_death import die_with_parent
from speckv.services.common.rpc.poller_race import quiet_closed_channel_pollers

SERVICES = ("kvstore", "predictor", "scheduler")
# The module whose main() runs each service's process.
SERVER_MODULES = {
    "kvstore": "speckv.services.kvstore.server",
    "predictor": "speckv.services.predictor.server",
    "scheduler": "speckv.services.scheduler.adapters.server",
}

# Commands whose modules live in speckv.loadgen: they ship in the same wheel,
# their dependencies in pyproject's `lab` extra (LAB_DEPS, import names).
LAB = ("bench", "demo", "simulate", "cost", "profile")
LAB_DEPS = ("torch", "matplotlib", "statsmodels")
LAB_INSTALL = "pip install 'speckv[lab]'"
TOOLS = {
    "up": ("speckv.services.cluster.up", "start predictor, scheduler and N kvstore nodes as processes"),
    "status": ("speckv.services.cluster.status", "print the scheduler's cluster state"),
    "node": ("speckv.services.cluster.node_cli", "add or remove a node of a running `speckv up`"),
    "etcd": ("speckv.services.cluster.etcd_process", "run a one-member etcd for scheduler replicas (docs/replicas.md)"),
    "certs": ("speckv.services.cluster.certs", "make a local CA and mutual-TLS certificates (docs/security.md)"),
    "health": ("speckv.services.cluster.health", "probe a service with the standard gRPC health protocol"),
    "bench": ("speckv.loadgen.bench.run", "run a benchmark: speckv bench NAME --help"),
    "demo": ("speckv.loadgen.demo", "start a local cluster and replay a slice of a real trace"),
    "simulate": ("speckv.loadgen.sim.cli", "the end-to-end comparison in virtual time, at any node count"),
    "cost": ("speckv.loadgen.experiments.cost_cli", "price per token of recompute, promotion and pull: the regime"),
    "profile": ("speckv.loadgen.profiles.cli", "fit an engine profile to Vidur's measurements"),
}


def _usage() -> str:
    lines = ["usage: speckv COMMAND [flags]   (speckv COMMAND --help for its flags)", "", "services:"]
    lines += [f"  {name:<10} run the {name} service" for name in SERVICES]
    lines += ["", "tools:"] + [f"  {name:<10} {text}" for name, (_, text) in TOOLS.items()]
    return "\n".join(lines)


def missing_lab_deps() -> list[str]:
    """The lab extra's packages this environment lacks (looked up, not imported)."""
    return [name for name in LAB_DEPS if importlib.util.find_spec(name) is None]


def configure_logging(environ: Mapping[str, str]) -> None:
    level = environ.get("SPECKV_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in SERVICES:
        module = SERVER_MODULES[command]
    elif command in TOOLS:
        module = TOOLS[command][0]
    else:
        print(f"speckv: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if command in LAB and (missing := missing_lab_deps()):
        print(f"speckv {command}: needs the lab extra ({', '.join(missing)} not installed): {LAB_INSTALL}",
              file=sys.stderr)
        return 2
    configure_logging(environ)
    quiet_closed_channel_pollers()
    die_with_parent(environ)
    try:
        return importlib.import_module(module).main(rest, environ)
    except SpeckvError as exc:
        print(f"speckv {command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
