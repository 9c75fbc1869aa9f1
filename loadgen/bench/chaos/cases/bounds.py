"""Chaos area `limits`, findings 4 and 5 of issue 43 as cases, each against
a real process of its own beside the cluster (neither touches the cluster's
services, so the areas after it see the cluster as it was):

- a scheduler started on a zero-length state file (`--state-dir` holding a
  0-byte scheduler.db) must refuse to start, exit non-zero with an error that
  names the file, never listen, and leave the file as it was (0 bytes, same
  modification time): before the fix SQLite took it for a new database and
  wrote a fresh schema into it ("never a silent reset", docs/state.md);
- a predictor with `--max-families-tracked CAP` fed FAMILY_FACTOR x CAP
  distinct families over ObserveArrivals (as the scheduler reports them) must
  keep its family table at CAP (GetModelInfo.families_tracked), accept every
  arrival, and still forecast the families it saw last. Its resident memory
  growth is a figure (docs/limits.md states the memory per family), not a
  verdict: the machine is shared.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from speckv.loadgen.bench.chaos.common import TIMEOUT
from speckv.loadgen.bench.chaos.report import Figure, Verdict
from speckv.services.cluster.launcher import wait_serving
from speckv.services.cluster.parent_death import child_environ
from speckv.services.common.rpc.tls import TlsFiles, dial
from speckv.services.scheduler.adapters.state_store import DB_FILE
from speckv.v1 import predictor_pb2, predictor_pb2_grpc

if TYPE_CHECKING:
    from speckv.loadgen.bench.chaos.cli import Context

AREA = "limits"
FAMILY_CAP = 500
FAMILY_FACTOR = 10  # distinct families sent per family the cap allows
START_S = 60.0  # a one-off process starts (or refuses) within this; a deadline, not a measurement
MIB = 1 << 20


def run(ctx: "Context") -> None:
    _empty_state_file(ctx)
    _family_cap(ctx)


def _command(ctx: "Context", kind: str, tls: TlsFiles, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "speckv.services.cli", kind, "--host", "127.0.0.1", "--port", "0",
            "--metrics-port", "0", *args, "--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca]


def _empty_state_file(ctx: "Context") -> None:
    cluster = ctx.cluster
    assert cluster.certs is not None
    state_dir = cluster.run_dir / "empty-state"
    state_dir.mkdir(parents=True, exist_ok=True)
    db = state_dir / DB_FILE
    db.write_bytes(b"")
    mtime_ns = db.stat().st_mtime_ns

    def case() -> Verdict:
        command = _command(ctx, "scheduler", cluster.certs.service("scheduler"),
                           ["--state-dir", str(state_dir), "--engine-profile", "tiny", "--tick-s", "0.1"])
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=START_S, stdin=subprocess.DEVNULL,
                                  env=child_environ({**os.environ, "PYTHONUNBUFFERED": "1"}))
        except subprocess.TimeoutExpired:
            return Verdict(False, f"still running after {START_S:.0f} s: it took the empty file as a state")
        said = (done.stdout + done.stderr).strip()
        untouched = db.stat().st_size == 0 and db.stat().st_mtime_ns == mtime_ns
        named, listened = str(db) in said, "listening on" in said
        ok = done.returncode != 0 and named and not listened and untouched and "Traceback" not in said
        return Verdict(ok, f"exit {done.returncode}; error names the file: {named}; listened: {listened}; file "
                           f"{'untouched (0 bytes, same mtime)' if untouched else 'CHANGED'}; said: {said[-200:]!r}")

    ctx.recorder.case(AREA, "scheduler started on a zero-length state file", "refuses to start (exit != 0, never listens) with an error naming the file; the file "
             "is left untouched", case)


def _family_cap(ctx: "Context") -> None:
    cluster = ctx.cluster
    assert cluster.certs is not None
    log_path = cluster.run_dir / "predictor-capped.log"
    tls = cluster.certs.service("predictor")
    sent = FAMILY_CAP * FAMILY_FACTOR
    with open(log_path, "ab") as log:
        process = subprocess.Popen(_command(ctx, "predictor", tls, ["--max-families-tracked", str(FAMILY_CAP)]),
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=child_environ({**os.environ, "PYTHONUNBUFFERED": "1"}))
    try:
        address = _listening(log_path, process)
        wait_serving(address, time.monotonic() + START_S, cluster.admin)
        channel = dial(address, cluster.identity("scheduler"), "predictor")
        try:
            _family_cap_cases(ctx, predictor_pb2_grpc.PredictorStub(channel), process.pid, sent)
        finally:
            channel.close()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _family_cap_cases(ctx: "Context", stub: predictor_pb2_grpc.PredictorStub, pid: int, sent: int) -> None:
    rec = ctx.recorder
    outcome: dict[str, object] = {}

    def case() -> Verdict:
        now = stub.Forecast(predictor_pb2.ForecastRequest(max_families=1), timeout=TIMEOUT).now_s
        before = _rss_bytes(pid)
        summary = stub.ObserveArrivals(_arrivals(now, sent), timeout=6 * TIMEOUT)
        info = stub.GetModelInfo(predictor_pb2.ModelInfoRequest(), timeout=TIMEOUT)
        outcome["growth"] = (_rss_bytes(pid) - before) / MIB
        last = [f"flood-{i}" for i in range(sent - 3, sent)]
        known = stub.Forecast(predictor_pb2.ForecastRequest(families=last, now_s=now + 1.0), timeout=TIMEOUT)
        all_known = all(f.known for f in known.forecasts) and len(known.forecasts) == len(last)
        ok = (summary.accepted == sent and summary.rejected == 0 and info.families_tracked == FAMILY_CAP
              and info.observations_total >= sent and all_known)
        return Verdict(ok, f"{summary.accepted} accepted, {summary.rejected} rejected; families tracked "
                           f"{info.families_tracked} (cap {FAMILY_CAP}); observations {info.observations_total}; the "
                           f"last families sent still known: {all_known}")

    rec.case(AREA, f"predictor fed {sent:,} distinct families, cap {FAMILY_CAP}",
             f"every arrival accepted; GetModelInfo.families_tracked == {FAMILY_CAP} (the least recently seen "
             "dropped); the latest families still forecast as known", case)
    if "growth" in outcome:
        rec.figure(AREA, Figure(f"capped predictor RSS growth over {sent:,} families", float(outcome["growth"]),
                                "MiB", "bounded: issue 43 saw +174 MiB for 50,000 uncapped"))


def _arrivals(now: float, count: int) -> Iterator[predictor_pb2.Arrival]:
    # Spread over the last second, oldest first, so the last families sent are the most recently seen.
    for i in range(count):
        yield predictor_pb2.Arrival(time_s=now - 1.0 + i / count, family=f"flood-{i}", node_id="node-0",
                                    prompt_tokens=64)


def _listening(log_path: Path, process: subprocess.Popen) -> str:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        for line in text.splitlines():
            if "listening on " in line:
                return line.split("listening on ", 1)[1].split()[0]
        if process.poll() is not None:
            raise RuntimeError(f"the capped predictor exited with {process.returncode}; see {log_path}")
        time.sleep(0.05)
    raise RuntimeError(f"the capped predictor did not start in {START_S:.0f} s; see {log_path}")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
