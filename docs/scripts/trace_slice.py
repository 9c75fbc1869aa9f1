"""What the retain analyses share: a trace slice set up as `speckv simulate`
sets it up (seed 7, the builtin predictor, the committed e2e configuration,
the warm-up history before it and the session-return model trained on the
turns before its start), and a Simulation of it for one policy."""
import math
from dataclasses import dataclass, replace

from speckv.loadgen.experiments.e2e_config import E2EConfig, load_e2e_config
from speckv.loadgen.sim import jobs
from speckv.loadgen.sim.returns import train_returns
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import SliceView


@dataclass
class TraceSlice:
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


def trace_slice(trace: str, start: float, end: float, nodes: int, policy: str) -> TraceSlice:
    """[start, end) s of trace at nodes (end inf: to the trace's end)."""
    config = load_e2e_config(None)
    job = jobs.Job(trace, 7, nodes, policy, start, None if math.isinf(end) else end - start, "builtin", 1.0, None)
    workload, _ = jobs.build_workload(job, config)
    lo, hi = workload.window(start, end)
    hlo, _ = workload.window(start - config.warmup_s, start)
    base, _ = jobs.build_workload(replace(job, nodes=config.nodes), config)
    _, before = base.window(-math.inf, start)
    returns = train_returns([base[i] for i in range(before)], start)
    return TraceSlice(config, nodes, workload, lo, hi, [workload[i] for i in range(hlo, lo)], returns)
