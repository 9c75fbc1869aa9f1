"""How well the session-return forecasts the planner prices are calibrated,
as the planner consumes them: every RETURN forecast (P(the family's next
request within the replica lease), from loadgen/sim/returns.py) handed to
`predictive` during a run, labelled by whether a request of that family
arrived within its horizon, binned by P; and the same for the forecasts the
planner bought an order for (`OrderSpec.forecast` "return").

    .venv/bin/python docs/scripts/return_forecast_calibration.py document-bursts 7

Runs the source (not the compiled build: it wraps two methods), the scenario
at heldout_seeds.py's slice (16 nodes, [1800, 2400) s). A measurement, not a
choice: used for docs/planner.md ("Which forecast bought the unread replicas").
"""
import bisect
import collections
import math
import sys

import heldout_seeds
import numpy as np

from speckv.loadgen.sim import jobs
from speckv.loadgen.sim import returns as returns_module
from speckv.services.scheduler.forecasts import ForecastKind
from speckv.services.scheduler.replication import planner as planner_module

BINS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0001)

seen: list[tuple[float, str, float, float]] = []  # (now, family, P, horizon s), once per refresh
bought: dict[tuple[float, str], list[str]] = collections.defaultdict(list)  # (now, family) -> actions


def wrap() -> None:
    forecast, plan = returns_module.ReturnForecasts.forecast, planner_module.Planner.plan
    last: list[object] = [None]

    def forecast_logged(self, now, horizon_s, max_families):
        out = forecast(self, now, horizon_s, max_families)
        if out and out is not last[0] and out[0].kind is ForecastKind.RETURN:
            last[0] = out
            seen.extend((now, f.family, f.expected_count, f.horizon_s) for f in out)
        return out

    def plan_logged(self, now, view, forecasts, policy):
        result = plan(self, now, view, forecasts, policy)
        for spec in result.orders:
            if spec.forecast == ForecastKind.RETURN.value:
                bought[(now, spec.family)].append(spec.action.value)
        return result

    returns_module.ReturnForecasts.forecast = forecast_logged
    planner_module.Planner.plan = plan_logged


def arrivals(scenario: str, seed: int) -> dict[str, list[float]]:
    config = jobs.cell_config(None, ())
    job = jobs.Job(source=scenario, seed=seed, nodes=heldout_seeds.NODES, policy="none",
                   start_s=heldout_seeds.START_S, duration_s=heldout_seeds.DURATION_S, predictor="builtin",
                   speed=1.0, config_path=None, synthetic=True)
    workload, _ = jobs.build_workload(job, config)
    by: dict[str, list[float]] = collections.defaultdict(list)
    for i in range(len(workload)):
        by[workload[i].family].append(float(workload.times[i]))
    return {family: sorted(times) for family, times in by.items()}


def came(times: list[float], now: float, horizon_s: float) -> bool:
    i = bisect.bisect_right(times, now)
    return i < len(times) and times[i] <= now + horizon_s


def table(title: str, rows: list[tuple[float, bool]]) -> None:
    print(f"{title}: {len(rows)} forecasts")
    print("| P bin | forecasts | mean P | share that came |")
    print("|---|---:|---:|---:|")
    p = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows], dtype=float)
    for lo, hi in zip(BINS, BINS[1:]):
        mask = (p >= lo) & (p < hi)
        if mask.any():
            print(f"| [{lo:.2f}, {min(hi, 1):.2f}) | {int(mask.sum())} | {p[mask].mean():.3f} | {y[mask].mean():.3f} |")
    if len(p):
        print(f"| all | {len(p)} | {p.mean():.3f} | {y.mean():.3f} |")


def main(scenario: str, seed: int) -> None:
    wrap()
    row = heldout_seeds.run((scenario, seed, "predictive"))
    print(f"{scenario} seed {seed}: burst p99 {row['burst_ttft_p99_ms']:.0f} ms")
    by_family = arrivals(scenario, seed)
    labelled = [(p, came(by_family.get(family, []), now, horizon)) for now, family, p, horizon in seen
                if p >= 0.05 and math.isfinite(p)]
    table("every RETURN forecast the planner was handed (P >= 0.05)", labelled)
    handed: dict[str, list[tuple[float, float, float]]] = collections.defaultdict(list)  # family -> (now, P, h)
    for now, family, p, horizon in seen:
        handed[family].append((now, p, horizon))
    for action in ("replicate", "prefetch"):
        ordered = []
        for (now, family), actions in bought.items():
            entries = handed.get(family, [])
            i = bisect.bisect_right(entries, (now, math.inf, math.inf)) - 1  # the forecast in force at the order
            if action in actions and i >= 0:
                _, p, horizon = entries[i]
                ordered.append((p, came(by_family.get(family, []), now, horizon)))
        table(f"the forecasts a {action} order was bought for (one per tick and family)", ordered)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
