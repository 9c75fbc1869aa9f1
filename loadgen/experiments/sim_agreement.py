"""The simulator against a live run of the same slice: each policy's TTFT
percentiles, live and simulated, and their ratio (sim / live). `speckv demo
--engine vllm` prints it for the real engines (the simulator's emulated
engine on the profile fitted to them, against the real vLLM servers); the
bound it is held to is stated where it was measured (docs/vllm_connector.md),
not here, since it is a measurement of this machine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from speckv.loadgen.experiments.metrics import RequestRecord, percentile

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class Agreement:
    """One policy's TTFT percentiles in ms (keys: PERCENTILES), live and
    simulated; empty where the run served nothing."""

    policy: str
    live_ms: dict[int, float]
    sim_ms: dict[int, float]

    @property
    def ratios(self) -> dict[int, float]:
        """sim / live per percentile both runs have (live > 0)."""
        return {p: self.sim_ms[p] / self.live_ms[p] for p in PERCENTILES
                if self.live_ms.get(p) and p in self.sim_ms}

    def line(self) -> str:
        return f"{self.policy}: " + ", ".join(
            f"p{p} {self.sim_ms[p]:.0f} simulated / {self.live_ms[p]:.0f} live ms = {r:.2f}x"
            for p, r in self.ratios.items())

    def to_json(self) -> dict[str, object]:
        return {"policy": self.policy, "live_ttft_ms": {f"p{p}": v for p, v in self.live_ms.items()},
                "sim_ttft_ms": {f"p{p}": v for p, v in self.sim_ms.items()},
                "sim_over_live": {f"p{p}": round(v, 3) for p, v in self.ratios.items()}}


def ttft_percentiles(records: Sequence[RequestRecord]) -> dict[int, float]:
    ttfts = [r.ttft_ms for r in records if r.served]
    return {p: percentile(ttfts, p) for p in PERCENTILES} if ttfts else {}


def agreement(policy: str, live: Sequence[RequestRecord], simulated: Sequence[RequestRecord]) -> Agreement:
    return Agreement(policy, ttft_percentiles(live), ttft_percentiles(simulated))
