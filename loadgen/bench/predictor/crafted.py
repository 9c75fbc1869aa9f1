"""`speckv bench predictor --crafted N`: N crafted model directories offered
to a live predictor by ReloadModel (issue 22, item 5: "100 crafted model
directories: 0 predictor deaths, 0 INTERNAL").

One small LightGBM model is trained on planted counts (predictor/planted.py,
quick rounds, with its compiled trees where this host builds them), a second
one (another seed) beside it as "another model" for the swapped libraries.
A real `speckv predictor` process is started on loopback (plaintext, so the
caller is the admin) with the good model as --model-dir and a temporary
model root, and fed PLANTED_FEED_S of planted arrivals. Then, one at a time,
directory i is derived from the good model under the root, with the mutation
kind KINDS[i % len(KINDS)] and a variant drawn from random.Random(f"{seed}:{i}")
(so a run is the same for a seed, and directory i is the same whatever N),
offered by name, and removed again. After every reload the service is
checked: the process still runs, GetModelInfo answers and still names the
good model, and a Forecast of three families answers with finite values
from the good model's version.

Counted per kind: the reload's status codes, deaths (the process gone, or
a check answered UNAVAILABLE), wedges (a check that does not answer within
CHECK_TIMEOUT_S; the process is then restarted, as after a death), INTERNAL
codes (of the reload, or of a check after it), and reloads that succeeded. A success is listed with what serves
after it (GetModelInfo's `inference`) and whether its forecast is finite;
the good model is then reloaded, so the next directory is judged against
it. A success is expected where a compiled library is damaged (the model
falls back to LightGBM's predict, the same outputs) and where the damage
leaves a booster LightGBM reads as a valid model; each is named in the
report, so a reader judges it.

The target counts deaths, wedges and INTERNAL: all three must be 0. Whether
a crafted directory is refused with INVALID_ARGUMENT or FAILED_PRECONDITION
is the service's choice (docs/predictor.md, "Reload by name").

The builders (kinds.py, one per mutation kind, over damage.py's file edits)
are also what tests/services/test_predictor_hardening.py makes its crafted
directories with.
"""
from __future__ import annotations

import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import grpc

from speckv.loadgen.bench.predictor.damage import read_manifest
from speckv.loadgen.bench.predictor.kinds import (
    GOOD,
    OUTSIDE_MARKER,
    CraftContext,
    Crafted,
    craft,
    kinds_for,
    remove_crafted,
)
from speckv.loadgen.bench.predictor.planted import planted_arrivals, save_planted_model
from speckv.loadgen.bench.transfer.procs import read_address
from speckv.services.cluster.parent_death import child_environ
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc

PLANTED_FEED_S = 590.0  # arrivals fed at start: within the predictor's default 600 s window
FEED_SEED = 9
CHECK_FAMILIES = ("steady-a", "bursty", "never-seen")
CHECK_TIMEOUT_S = 30.0  # a check unanswered this long is a wedged predictor
PROBE_TIMEOUT_S = 60.0  # the predictor's default reload_probe_timeout_s (what operators run)




# --- the predictor process ------------------------------------------------------------------------

@dataclass(slots=True)
class PredictorProcess:
    """A `speckv predictor` child on loopback (plaintext: every caller is the admin)."""

    popen: subprocess.Popen
    address: str
    log_path: Path
    channel: grpc.Channel = field(init=False)
    stub: predictor_pb2_grpc.PredictorStub = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.address)
        self.stub = predictor_pb2_grpc.PredictorStub(self.channel)

    def exit_reason(self) -> str:
        """"" while running; else how it ended."""
        code = self.popen.poll()
        if code is None:
            return ""
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"

    def stop(self) -> None:
        self.channel.close()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_predictor(model_dir: Path, root: Path, log_path: Path, probe_timeout_s: float,
                    timeout_s: float = 120.0) -> PredictorProcess:
    """`python -m speckv.services.cli predictor` on 127.0.0.1:<free port>
    serving model_dir, reloading by name under root; it dies with us."""
    env = child_environ({**os.environ, "PYTHONUNBUFFERED": "1"})
    env.setdefault("SPECKV_LOG_LEVEL", "WARNING")
    argv = [sys.executable, "-m", "speckv.services.cli", "predictor", "--host", "127.0.0.1", "--port", "0",
            "--model-dir", str(model_dir), "--model-root", str(root),
            "--reload-probe-timeout-s", f"{probe_timeout_s:g}"]
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env)
    address = read_address(popen, timeout_s)
    if address is None:
        popen.kill()
        popen.wait(timeout=30)
        raise RuntimeError(f"the predictor did not start: {log_path.read_text(errors='replace')[-2000:]}")
    process = PredictorProcess(popen, address, log_path)
    times, names = planted_arrivals(PLANTED_FEED_S, seed=FEED_SEED, start_s=time.time() - PLANTED_FEED_S)
    stream = (pb.Arrival(time_s=float(t), family=n) for t, n in zip(times, names))
    process.stub.ObserveArrivals(stream, timeout=timeout_s)
    return process


@dataclass(slots=True)
class Check:
    """The service after one reload: 'ok', or 'dead' / 'wedged' / 'unhealthy' and why."""

    state: str
    detail: str = ""
    code: str = ""  # the status code of a check that failed
    source: str = ""
    version: str = ""
    inference: str = ""
    finite: bool = True


def check_service(process: PredictorProcess) -> Check:
    """Alive, GetModelInfo and a Forecast answer, and the forecast is finite."""
    if process.exit_reason():
        return Check("dead", process.exit_reason())
    try:
        info = process.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=CHECK_TIMEOUT_S)
        forecast = process.stub.Forecast(pb.ForecastRequest(families=list(CHECK_FAMILIES)), timeout=CHECK_TIMEOUT_S)
    except grpc.RpcError as exc:
        code = exc.code()
        if process.exit_reason() or code == grpc.StatusCode.UNAVAILABLE:
            return Check("dead", process.exit_reason() or f"UNAVAILABLE: {exc.details()}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Check("wedged", f"no answer within {CHECK_TIMEOUT_S:g} s")
        return Check("unhealthy", f"{code.name}: {exc.details()}", code=code.name)
    values = [v for f in forecast.forecasts for h in f.horizons
              for v in (h.expected_count, h.upper_quantile, h.burst_probability)]
    finite = bool(values) and all(math.isfinite(v) for v in values)
    if forecast.model_version != info.version:
        return Check("unhealthy", f"Forecast from {forecast.model_version!r}, GetModelInfo says {info.version!r}")
    return Check("ok", source=os.path.realpath(info.source), version=info.version, inference=info.inference,
                 finite=finite)


# --- the run --------------------------------------------------------------------------------------

def run_crafted(n: int, seed: int, probe_timeout_s: float = PROBE_TIMEOUT_S, workdir: Path | None = None,
                echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Offers n crafted directories to a live predictor (module docstring);
    the report `speckv bench predictor --json` writes under "crafted"."""
    began = time.perf_counter()
    base = Path(tempfile.mkdtemp(prefix="speckv-crafted-", dir=workdir))
    try:
        return _run(n, seed, probe_timeout_s, base, echo, began)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(n: int, seed: int, probe_timeout_s: float, base: Path, echo: Callable[[str], None],
         began: float) -> dict[str, Any]:
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    t0 = time.perf_counter()
    good = save_planted_model(root / GOOD)
    other = save_planted_model(outside / "other", seed=2, version="lgbm-other")
    train_s = time.perf_counter() - t0
    ctx = CraftContext(root, outside, good, other, read_manifest(good))
    kinds = kinds_for(ctx)
    good_real = os.path.realpath(good)
    echo(f"\n== crafted model directories: {n} over {len(kinds)} kinds (seed {seed}); good model trained in "
         f"{train_s:.1f} s; predictor reload probe timeout {probe_timeout_s:g} s")
    process = start_predictor(good, root, base / "predictor.log", probe_timeout_s)
    rows: list[dict[str, Any]] = []
    restarts = 0
    try:
        for i in range(n):
            crafted = craft(ctx, kinds, seed, i)
            row = _offer(process, crafted, probe_timeout_s)
            remove_crafted(root, crafted.name)
            check = check_service(process)
            row.update(service=check.state, service_detail=check.detail, check_code=check.code)
            if check.state == "ok" and row["code"] == "OK":
                row.update(accepted_inference=check.inference, accepted_finite=check.finite,
                           serving_crafted=check.source != good_real)
            elif check.state == "ok" and (check.source != good_real or not check.finite):
                row.update(service="unhealthy", service_detail=f"serving {check.source} after a refusal "
                                                               f"(finite: {check.finite})")
            if row["code"] in ("UNAVAILABLE",) or check.state in ("dead", "wedged"):
                row["log_tail"] = process.log_tail()
                process.stop()
                restarts += 1
                process = start_predictor(good, root, base / f"predictor-{restarts}.log", probe_timeout_s)
            elif row["code"] == "OK" or check.state != "ok":
                process.stub.ReloadModel(pb.ReloadModelRequest(name=GOOD), timeout=probe_timeout_s + 60)
            rows.append(row)
            echo(f"  {i:>3} {crafted.kind:<27} {row['code']:<20} {row['ms']:>7.0f} ms  {check.state:<9} "
                 f"{crafted.variant[:70]}")
    finally:
        process.stop()
    return _report(n, seed, kinds, rows, restarts, train_s, probe_timeout_s, time.perf_counter() - began)


def _offer(process: PredictorProcess, crafted: Crafted, probe_timeout_s: float) -> dict[str, Any]:
    """ReloadModel(name) once: the code, its message (cut) and the wall time."""
    t0 = time.perf_counter()
    try:
        process.stub.ReloadModel(pb.ReloadModelRequest(name=crafted.name), timeout=probe_timeout_s + 60)
        code, detail = "OK", ""
    except grpc.RpcError as exc:
        code, detail = exc.code().name, exc.details() or ""
    ms = (time.perf_counter() - t0) * 1e3
    return {"kind": crafted.kind, "variant": crafted.variant, "name": crafted.name[:80], "code": code,
            "detail": detail[:300], "leaks_outside": OUTSIDE_MARKER in detail, "ms": ms}


def _report(n: int, seed: int, kinds: list[str], rows: list[dict[str, Any]], restarts: int, train_s: float,
            probe_timeout_s: float, wall_s: float) -> dict[str, Any]:
    per_kind: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        ms = [r["ms"] for r in mine]
        per_kind[kind] = {
            "tried": len(mine), "codes": dict(Counter(r["code"] for r in mine).most_common()),
            "deaths": sum(r["service"] == "dead" or r["code"] == "UNAVAILABLE" for r in mine),
            "wedged": sum(r["service"] == "wedged" for r in mine),
            "unhealthy": sum(r["service"] == "unhealthy" for r in mine),
            "internal": sum(r["code"] == "INTERNAL" or r.get("check_code") == "INTERNAL" for r in mine),
            "accepted": sum(r["code"] == "OK" for r in mine),
            "leaks": sum(r["leaks_outside"] for r in mine),
            "ms_median": statistics.median(ms), "ms_max": max(ms)}
    totals = {key: sum(k[key] for k in per_kind.values())
              for key in ("tried", "deaths", "wedged", "unhealthy", "internal", "accepted", "leaks")}
    totals["codes"] = dict(Counter(r["code"] for r in rows).most_common())
    totals["ms_median"] = statistics.median(r["ms"] for r in rows) if rows else 0.0
    totals["ms_max"] = max((r["ms"] for r in rows), default=0.0)
    met = totals["deaths"] == 0 and totals["wedged"] == 0 and totals["internal"] == 0
    accepted = [{k: r[k] for k in ("kind", "variant", "accepted_inference", "accepted_finite") if k in r}
                for r in rows if r["code"] == "OK"]
    return {"n": n, "seed": seed, "kinds": kinds, "probe_timeout_s": probe_timeout_s, "train_s": train_s,
            "wall_s": wall_s, "restarts": restarts, "per_kind": per_kind, "totals": totals,
            "target": "0 predictor deaths, 0 INTERNAL", "target_met": met, "accepted": accepted, "reloads": rows}


def print_crafted(report: dict[str, Any]) -> None:
    """The per-kind table, the totals against the target, and every accepted directory."""
    print(f"\n{'kind':<28}{'tried':>6}{'deaths':>7}{'wedged':>7}{'INTERNAL':>9}{'accepted':>9}{'ms med':>8}"
          f"{'ms max':>8}  codes")
    rows = [*report["per_kind"].items(), ("total", report["totals"])]
    for kind, k in rows:
        codes = ", ".join(f"{c} {v}" for c, v in k["codes"].items())
        print(f"{kind:<28}{k['tried']:>6}{k['deaths']:>7}{k['wedged']:>7}{k['internal']:>9}{k['accepted']:>9}"
              f"{k['ms_median']:>8.0f}{k['ms_max']:>8.0f}  {codes}")
    t = report["totals"]
    print(f"target: {report['target']}: {'met' if report['target_met'] else 'NOT MET'} ({t['deaths']} deaths, "
          f"{t['wedged']} wedged, {t['internal']} INTERNAL, {t['unhealthy']} unhealthy after a reload, "
          f"{t['leaks']} answers echoing a file outside the root; {report['restarts']} restarts; "
          f"{report['wall_s']:.0f} s)")
    for a in report["accepted"]:
        print(f"  accepted: {a['kind']}: {a['variant']} -> finite forecast: {a.get('accepted_finite')}; "
              f"{a.get('accepted_inference', '')[:90]}")
