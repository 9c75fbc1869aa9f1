"""`speckv bench chaos`: a chaos and fuzz suite against a real cluster
(issue 23, item 6; docs/chaos.md).

It starts a mutual-TLS cluster of real `speckv` processes (chaos/cluster.py)
and runs every case of the issue, bounded in count and time: the abuses of
its opening (each must now be refused or harmless), kill -9 of each service
mid-traffic, a slow peer, a full pool, a partitioned node, idle data plane
connections and streams, a scheduler killed and restarted on its
--state-dir under replay, and a kvstore killed in the middle of a burst
through the reference router (issue 27, chaos/cases/membership.py), and
the scheduler killed mid-replay under the reference router's fail-open
routing client (issue 43, chaos/cases/routing.py). Each
case states its expected outcome and records the observed one; per area it
prints cases tried and cases that behaved correctly. `--json PATH` writes
one object per area with `tried`, `correct`, its cases (expected, observed)
and its figures (measurements against the issue's targets, reported, never
judged). `--quick` runs every case at a smaller scale.

Where the machine allows (`unshare --net` and `ip`), the suite re-executes
itself in a private network namespace, so its nftables partition touches
nobody else's traffic; elsewhere the partition stalls the suite's own TCP
forwarders instead.

Exit status: 0 when every case behaved correctly, 1 otherwise.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from speckv.loadgen.bench.chaos import report
from speckv.loadgen.bench.chaos.cases.membership import VICTIM, VICTIM_FLAGS
from speckv.loadgen.bench.chaos.cluster import NETNS_ENV, ChaosCluster, ChaosSpec


@dataclass(frozen=True, slots=True)
class Scale:
    """How big each case is; --quick divides the expensive ones."""

    idle_connections: int
    idle_streams: int
    latency_calls: int
    fuzz_calls: int
    tls_calls: int
    oversized_blocks: int
    # The kvstores' data_read_timeout_s: the silent-connection case waits it
    # out, and idle connections are measured inside it (the default in full runs).
    data_read_timeout_s: float
    # The pre-auth flood (cases/preauth.py): connections kept open and re-opened, from this many addresses.
    flood_connections: int
    flood_sources: int


FULL = Scale(idle_connections=500, idle_streams=200, latency_calls=1000, fuzz_calls=2000, tls_calls=2000,
             oversized_blocks=24, data_read_timeout_s=10.0, flood_connections=1000, flood_sources=64)
QUICK = Scale(idle_connections=100, idle_streams=140, latency_calls=150, fuzz_calls=200, tls_calls=0,
              oversized_blocks=3, data_read_timeout_s=2.0, flood_connections=300, flood_sources=32)


@dataclass(slots=True)
class Context:
    """What every case module gets."""

    cluster: ChaosCluster
    recorder: report.Recorder
    scale: Scale
    quick: bool
    bait: socket.socket  # a listener nothing may ever connect to (the "fake kvstore" of the attacks)

    @property
    def bait_address(self) -> str:
        return f"127.0.0.1:{self.bait.getsockname()[1]}"

    def bait_untouched(self) -> bool:
        try:
            conn, _ = self.bait.accept()
        except BlockingIOError:
            return True
        conn.close()
        return False


def _areas() -> list[tuple[str, Callable[[Context], None]]]:
    from speckv.loadgen.bench.chaos.cases import dataplane, faults, identity, limits, load, membership, routing
    # Destructive areas last: faults, membership and routing kill and restart services.
    return [("identity", identity.run), ("dataplane", dataplane.run),
            ("limits", limits.run), ("load", load.run),
            ("faults", faults.run), ("membership", membership.run), ("routing", routing.run)]


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    parser = argparse.ArgumentParser(prog="speckv bench chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every case at a smaller scale (CI)")
    parser.add_argument("--json", default="", help="write the per-area results here")
    parser.add_argument("--run-dir", default="", help="logs, certificates and state (default: a temporary dir)")
    parser.add_argument("--netns", choices=("auto", "off"), default="auto",
                        help="auto: run inside a private network namespace where the machine allows")
    parser.add_argument("--areas", default="", help="comma-separated areas to run (default: all)")
    args = parser.parse_args(list(argv))
    if args.netns == "auto" and environ.get(NETNS_ENV) is None and _netns_allowed():
        return _in_private_netns(list(argv), environ)
    if environ.get(NETNS_ENV) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
    with tempfile.TemporaryDirectory(prefix="speckv-chaos-") as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tmp)
        return _run(args, run_dir, environ)


def _run(args: argparse.Namespace, run_dir: Path, environ: Mapping[str, str]) -> int:
    scale = QUICK if args.quick else FULL
    wanted = {a for a in args.areas.split(",") if a}
    recorder = report.Recorder()
    # The membership area's victim sends replication through a link cap, so its orders stay open.
    spec = ChaosSpec(data_read_timeout_s=scale.data_read_timeout_s, node_extra={VICTIM: VICTIM_FLAGS})
    cluster = ChaosCluster(spec, run_dir, environ)
    started = time.monotonic()
    print(f"speckv bench chaos{' --quick' if args.quick else ''}: starting a mutual-TLS cluster in {run_dir}",
          flush=True)
    bait = socket.create_server(("127.0.0.1", 0))
    bait.setblocking(False)
    try:
        cluster.start()
        assert cluster.partition is not None
        print(f"cluster up in {time.monotonic() - started:.1f} s; partition by {cluster.partition.mechanism}",
              flush=True)
        context = Context(cluster, recorder, scale, args.quick, bait)
        for name, run in _areas():
            if wanted and name not in wanted:
                continue
            print(f"{name}:", flush=True)
            _run_area(name, run, context)
        _hygiene(context)
    finally:
        cluster.stop()
        bait.close()
    elapsed = time.monotonic() - started
    for line in recorder.summary_lines():
        print(line)
    print(f"{elapsed:.1f} s", flush=True)
    if args.json:
        meta = {"command": "speckv bench chaos" + (" --quick" if args.quick else ""),
                "date": dt.date.today().isoformat(), "seconds": round(elapsed, 1),
                "partition": cluster.partition.mechanism if cluster.partition else "",
                "network_namespace": environ.get(NETNS_ENV) == "1"}
        recorder.write_json(Path(args.json), meta)
    return 0 if all(a.correct == a.tried for a in recorder.areas.values()) else 1


def _run_area(name: str, run: Callable[[Context], None], context: Context) -> None:
    """Runs an area; a failure outside its cases' own checks (its set-up) is
    recorded as one more incorrect case, and the suite goes on."""
    try:
        run(context)
    except Exception as exc:  # noqa: BLE001 - reported as a result; later areas still run
        verdict = report.Verdict(False, f"aborted: {type(exc).__name__}: {str(exc)[:300]}")
        context.recorder.case(name, "area set-up", "the area runs to its end", lambda: verdict)


def _hygiene(context: Context) -> None:
    """What must hold over the whole run: no service died that the suite did
    not kill, no traceback in a log, no INTERNAL, nothing ever connected to
    the bait."""
    cluster, recorder = context.cluster, context.recorder

    def alive() -> report.Verdict:
        dead = [f"{s.name} (exit {s.popen.poll() if s.popen else None})" for s in cluster.services.values()
                if not s.alive()]
        return report.Verdict(not dead, "every service running" if not dead else f"dead: {', '.join(dead)}")

    def tracebacks() -> report.Verdict:
        found = {s.name: s.log_path.read_text(errors="replace").count("Traceback")
                 for s in cluster.services.values()}
        bad = {k: v for k, v in found.items() if v}
        return report.Verdict(not bad, "no traceback in any log" if not bad else f"tracebacks: {bad}")

    def faults() -> report.Verdict:
        seen = report.FAULTS_SEEN
        return report.Verdict(not seen, f"{len(seen)} INTERNAL/UNKNOWN" + (f": {seen[:5]}" if seen else ""))

    def bait() -> report.Verdict:
        ok = context.bait_untouched()
        return report.Verdict(ok, "no connection to the unregistered address" if ok else "someone connected")

    recorder.case("hygiene", "no service crashed", "every service the suite did not kill is running", alive)
    recorder.case("hygiene", "no traceback logged", "no service log holds a traceback", tracebacks)
    recorder.case("hygiene", "no INTERNAL", "no call of the run ended INTERNAL or UNKNOWN", faults)
    recorder.case("hygiene", "nothing dialled the bait", "no service ever connected to the unregistered address "
                  "any attack named", bait)


def _netns_allowed() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    try:
        probe = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _in_private_netns(argv: list[str], environ: Mapping[str, str]) -> int:
    """Runs this command again under `unshare --net`; its output passes through."""
    command = ["unshare", "--net", sys.executable, "-m", "speckv.services.cli", "bench", "chaos", *argv]
    return subprocess.run(command, env={**environ, NETNS_ENV: "1"}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.environ))
