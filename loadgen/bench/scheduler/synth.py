"""A synthetic cluster for `speckv bench scheduler`: nodes, their block
inventory, their load, and a skewed request stream over prefix families.

Shape (defaults, the issue's): 1,000 nodes; 100,000 families, each a chain
of `blocks // families` blocks (1,000,000 indexed blocks in all) stored on
one node, the 1% most popular on three; family popularity Zipf(1.1); each
request is its family's chain plus 0-8 blocks of its own and a partial tail
block. Node loads are drawn uniformly up to ~4 s of queued prefill. The
engine profile is llama-3-8b-h100 (16-token blocks, 128 KiB per token).
Everything is drawn from one seeded NumPy generator, so runs are repeatable.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.forecasts import Forecast
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.routing.route_records import RouteRequestItem

PROFILE = "llama-3-8b-h100"
BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class SynthShape:
    nodes: int = 1000
    blocks: int = 1_000_000
    families: int = 100_000
    capacity_pages: int = 16_384
    seed: int = 0


class SyntheticCluster:
    def __init__(self, shape: SynthShape) -> None:
        self.shape = shape
        self.rng = np.random.default_rng(shape.seed)
        per_family = max(1, shape.blocks // shape.families)
        hashes = self.rng.choice(np.iinfo(np.int64).max, size=shape.families * per_family, replace=False)
        self.chains = hashes.reshape(shape.families, per_family)
        self.node_ids = [NodeId(f"n{i:04d}") for i in range(shape.nodes)]
        ranks = np.arange(1, shape.families + 1, dtype=np.float64)
        weights = ranks ** -1.1
        self.popularity = weights / weights.sum()

    def family(self, i: int) -> Family:
        return Family(f"fam{i:06d}")

    def populate(self, core: SchedulerCore) -> None:
        """Registers every node, stores every family's chain, sets loads."""
        s = self.shape
        for node in self.node_ids:
            address = f"10.0.{int(node[1:]) // 250}.{int(node[1:]) % 250}:7000"
            core.register_node(node, address, NodeSizes(s.capacity_pages), None)
        home = self.rng.integers(0, s.nodes, size=s.families)
        hot = max(1, s.families // 100)
        for i in range(s.families):
            nodes = [home[i]] if i >= hot else [home[i], (home[i] + 1) % s.nodes, (home[i] + 500) % s.nodes]
            chain = self.chains[i].tolist()
            for n in nodes:
                node = self.node_ids[int(n)]
                core.apply_kv_event(node, core.generation(node),
                                    IndexEvent(HolderEventKind.STORED, chain, False, self.family(i)))
        self.heartbeat_all(core)

    def heartbeat_all(self, core: SchedulerCore) -> None:
        for node in self.node_ids:
            self.heartbeat(core, node)

    def heartbeat(self, core: SchedulerCore, node: NodeId) -> None:
        queued = int(self.rng.integers(0, 120_000))  # up to ~4 s of prefill at 35 us/token
        core.heartbeat(node, NodeLoad(queued, int(self.rng.integers(0, 50_000)), int(self.rng.integers(0, 4096)),
                                      int(self.rng.integers(0, 16)), int(self.rng.integers(0, 8))))

    def requests(self, n: int) -> list[RouteRequestItem]:
        families = self.rng.choice(self.shape.families, size=n, p=self.popularity)
        extra = self.rng.integers(0, 9, size=n)
        tails = self.rng.integers(1, BLOCK_TOKENS, size=n)
        # own blocks are drawn above 2**63, the chains below: they never collide
        suffix = self.rng.integers(1 << 63, np.iinfo(np.uint64).max, size=int(extra.sum()), dtype=np.uint64).tolist()
        out, k = [], 0
        for j, (f, e, t) in enumerate(zip(families.tolist(), extra.tolist(), tails.tolist())):
            chain = self.chains[f].tolist() + suffix[k:k + e]
            k += e
            out.append(RouteRequestItem(f"r{j}", chain, len(chain) * BLOCK_TOKENS + t, self.family(f)))
        return out


class SyntheticForecasts:
    """A ForecastSource for the planner benchmark: each call, the top families
    by popularity with Poisson counts around their share of 2,000 requests/s,
    a random tenth of them bursting 10x (the planner's worst case: many
    families in excess at once)."""

    def __init__(self, cluster: SyntheticCluster, rate_per_s: float = 2000.0) -> None:
        self._c = cluster
        self._rate = rate_per_s

    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        rng = self._c.rng
        top = np.arange(min(max_families, self._c.shape.families))
        mean = self._c.popularity[top] * self._rate * horizon_s
        mean = np.where(rng.random(len(top)) < 0.1, mean * 10 + 20, mean)
        counts = rng.poisson(mean)
        return [Forecast(self._c.family(int(i)), horizon_s, float(m), float(c) * 1.5 + 2, 0.5)
                for i, m, c in zip(top.tolist(), mean.tolist(), counts.tolist())]
