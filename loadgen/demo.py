"""`speckv demo`: the end-to-end comparison on a short slice of a real trace.

Runs `speckv bench e2e --quick` on the conversation trace from the traces
directory with every policy (each against a fresh local cluster built from
services/config/e2e.json), prints the table and writes the HTML report.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Mapping, Sequence

from speckv.loadgen.bench import e2e
from speckv.services.common.errors import NotFound
from speckv.services.common.traces import resolve_traces_dir


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speckv demo", description=__doc__)
    parser.add_argument("--traces", default=None, help="traces directory [env SPECKV_TRACES; ../shared/traces]")
    parser.add_argument("--trace", default="mooncake_conversation_trace.jsonl", help="file in the traces directory")
    parser.add_argument("--policies", default=e2e.ALL_POLICIES)
    parser.add_argument("--duration-s", type=float, default=None, help="override the quick slice's length")
    parser.add_argument("--report", default=None, help="report directory [default: <run dir>/report]")
    parser.add_argument("--json", default=None, help="write the result JSON here")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parse_args(argv, environ)
    trace_path = resolve_traces_dir(args.traces, environ) / args.trace
    if not trace_path.exists():
        raise NotFound(f"trace {trace_path} not found")
    report = args.report or str(Path(environ.get("SPECKV_RUN_DIR") or f"/tmp/speckv-{os.getuid()}") / "report")
    bench_args = ["--trace", str(trace_path), "--policies", args.policies, "--quick", "--report", report]
    if args.duration_s is not None:
        bench_args += ["--duration-s", str(args.duration_s)]
    if args.json:
        bench_args += ["--json", args.json]
    return e2e.main(bench_args, environ)
