"""The scheduler process `speckv bench scheduler` measures over gRPC: the real
server (build_server, the same servicer, interceptors and telemetry as
`speckv scheduler`) whose nodes and block index are the synthetic cluster,
loaded in-process because its 1,000 nodes do not exist (no kvstore event
streams, no confirming Lookups). Prints `READY host:port` once serving and
exits when stdin closes.

    python -m speckv.loadgen.bench.scheduler.server NODES BLOCKS FAMILIES SEED
"""
from __future__ import annotations

import gc
import logging
import sys

from speckv.loadgen.bench.scheduler.synth import PROFILE, SyntheticCluster, SynthShape
from speckv.services.common.config import parse_config
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.server import build_server


def main(argv: list[str]) -> int:
    nodes, blocks, families, seed = (int(a) for a in argv)
    logging.getLogger("speckv.services.scheduler").setLevel(logging.WARNING)  # 1,000 registrations
    cluster = SyntheticCluster(SynthShape(nodes, blocks, families, seed=seed))
    config = parse_config(SchedulerConfig, ["--port", "0", "--engine-profile", PROFILE, "--no-confirm-routes",
                                            "--node-timeout-s", "86400", "--tick-s", "3600"], {}, prog="bench")
    server = build_server(config, build_telemetry("scheduler", {}), inventory=cluster.populate)
    gc.freeze()  # the synthetic index is ~1M long-lived objects: keep them out of every collection
    server.start()
    print(f"READY {server.address}", flush=True)
    sys.stdin.read()
    server.stop(grace_s=1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
