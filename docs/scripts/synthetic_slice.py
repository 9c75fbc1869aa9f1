"""The set-up the analysis scripts share: a synthetic scenario's slice, or a
trace's (`trace_slice`), as `speckv simulate` builds it (the workload at the
node count, the warm-up history before the slice, the session-return model
trained on the base workload before the slice), and one simulation of a
policy on it, its served records keyed by request id. Imported by the scripts beside it (run them as
`.venv/bin/python docs/scripts/NAME.py`, which puts this folder on the path)."""
import math
from dataclasses import dataclass, replace

from speckv.loadgen.experiments.e2e_config import E2EConfig, load_e2e_config
from speckv.loadgen.sim import jobs as J
from speckv.loadgen.sim.returns import train_returns
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import SliceView


@dataclass
class SyntheticSlice:
    config: E2EConfig
    nodes: int
    workload: object
    lo: int
    hi: int
    history: list
    returns: object

    def simulation(self, policy: str) -> Simulation:
        return Simulation(self.config, SimSettings.from_e2e(self.config, nodes=self.nodes), policy,
                          SliceView(self.workload, self.lo, self.hi), self.history, future=self.workload,
                          returns=self.returns)

    def run(self, policy: str) -> dict:
        return {r.request_id: r for r in self.simulation(policy).run().records if r.served}


def synthetic_slice(scenario: str, nodes: int, start: float, duration: float, seed: int = 7) -> SyntheticSlice:
    return _slice(J.Job(scenario, seed, nodes, "none", start, duration, "builtin", 1.0, None, synthetic=True))


def trace_slice(trace: str, nodes: int, start: float, end: float) -> SyntheticSlice:
    """[start, end) s of the trace at path `trace` (end inf: to its end), seed 7."""
    duration = None if math.isinf(end) else end - start
    return _slice(J.Job(trace, 7, nodes, "none", start, duration, "builtin", 1.0, None))


def _slice(job: J.Job) -> SyntheticSlice:
    config = load_e2e_config(None)
    start = job.start_s
    workload, _ = J.build_workload(job, config)
    lo, hi = workload.window(start, math.inf if job.duration_s is None else start + job.duration_s)
    hlo, _ = workload.window(start - config.warmup_s, start)
    history = [workload[i] for i in range(hlo, lo)]
    base, _ = J.build_workload(replace(job, nodes=config.nodes), config)  # as speckv simulate trains it
    _, before = base.window(-math.inf, start)
    returns = train_returns([base[i] for i in range(before)], start)
    return SyntheticSlice(config, job.nodes, workload, lo, hi, history, returns)
