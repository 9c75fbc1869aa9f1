"""Small scripted scheduler scenarios for the policy and planner tests: a
SchedulerCore on a manual clock with the llama-3-8b-h100 profile (16-token
blocks, 2 MiB per block) whose nodes hold what each test says."""
from __future__ import annotations

import dataclasses

from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.forecasts import Forecast, ForecastKind
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.ports import SchedulerSettings

BS = 16
CHAIN = list(range(5000, 5128))  # 128 blocks = 2,048 tokens of shared prefix
FAMILY = Family("doc")


class ScriptedForecasts:
    """A ForecastSource answering whatever the test last set: expected
    counts, and upper quantiles where `uppers` has one (else the count)."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = {}
        self.uppers: dict[str, float] = {}
        self.kinds: dict[str, ForecastKind] = {}  # a family not named here is a BURST forecast
        self.calls = 0

    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        self.calls += 1
        return [Forecast(Family(f), horizon_s, n, self.uppers.get(f, n), 1.0,
                         self.kinds.get(f, ForecastKind.BURST)) for f, n in self.counts.items()][:max_families]


def make_core(nodes: int = 4, policy: str = "none", forecasts=None, future=None, capacity: int = 4096,
              host_pages: int = 0, retain_max_blocks: int | None = None, disk_gbps: float = 0.0,
              **overrides) -> tuple[SchedulerCore, ManualClock]:
    """A core with nodes n0..n{nodes-1} (host tiers of host_pages blocks
    behind a 400 Gbit/s host link when > 0; disk tiers read at disk_gbps
    with 0.09 ms per load when > 0; each reporting retain_max_blocks,
    None: no retention cap reported); overrides patch policy config
    sections, e.g. planner={"horizon_s": 5.0}."""
    config = load_policy_config()
    for section, values in overrides.items():
        config = dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **values)})
    clock = ManualClock(100.0)
    settings = SchedulerSettings(node_timeout_s=5.0, policy=policy, policy_config=config,
                                 host_link_gbps=400.0 if host_pages else 0.0,
                                 host_link_overhead_ms=0.05 if host_pages else 0.0,
                                 disk_gbps=disk_gbps, disk_overhead_ms=0.09 if disk_gbps else 0.0)
    core = SchedulerCore(settings, clock, get_profile("llama-3-8b-h100"), forecasts=forecasts, future=future)
    for i in range(nodes):
        core.register_node(f"n{i}", f"127.0.0.1:{7000 + i}", NodeSizes(capacity, host_pages, retain_max_blocks), None)
    return core, clock


def store(core: SchedulerCore, node: str, hashes: list[int], family: str = FAMILY,
          kind: HolderEventKind = HolderEventKind.STORED) -> None:
    assert core.apply_kv_event(NodeId(node), core.generation(node), IndexEvent(kind, hashes, False, family))


def load(core: SchedulerCore, node: str, queued_tokens: int, free_pages: int = 4096) -> None:
    core.heartbeat(node, NodeLoad(queued_tokens=queued_tokens, free_pages=free_pages))


def heartbeat_all(core: SchedulerCore, nodes: int, free_pages: int = 4096) -> None:
    for i in range(nodes):
        core.heartbeat(f"n{i}", NodeLoad(free_pages=free_pages))


def route_family(core: SchedulerCore, n: int, family: str = FAMILY, chain: list[int] = CHAIN) -> list[str]:
    """Routes n requests of family (its chain plus one own block); returns the nodes."""
    picks = []
    for i in range(n):
        own = [10_000_000 + hash((family, i, len(picks))) % 1_000_000]
        picks.append(core.route(f"{family}-{i}", chain + own, (len(chain) + 1) * BS + 3, family).node_id)
    return picks
