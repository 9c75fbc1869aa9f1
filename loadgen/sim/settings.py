"""What one simulated run is configured by, taken from the live cluster's
configuration file (services/config/e2e.json) so the simulator and the live
cluster agree by default.

Intervals (heartbeat, scheduler tick, forecast poll) are trace seconds.
The live e2e run keeps them on the wall clock while replaying `speed` x
faster, so live-equivalent settings multiply them by `speed`
(`from_e2e(config, speed=...)`); a simulation of its own runs at speed 1.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from speckv.loadgen.experiments.e2e_config import E2EConfig
from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.node_sizes import NodeSizes


@dataclass(frozen=True, slots=True)
class SimSettings:
    nodes: int
    sizes: NodeSizes  # each node's tiers and retention cap (E2EConfig.node_sizes)
    heartbeat_s: float
    tick_s: float
    forecast_poll_s: float
    forecast_horizon_s: float
    warmup_s: float
    predictor: str = "builtin"
    drain_s: float = 600.0  # virtual time allowed after the last arrival for the engines to finish
    node_timeout_s: float = 6.0  # as the live e2e scheduler is started
    liveness_s: float = 1.0  # an idle, unchanged node still heartbeats this often
    # The session-return model learns online from the slice (online_returns.py); off keeps every committed figure
    online_returns: bool = False
    disk_pages: int = 0  # each node's disk tier below its host tier, blocks (0: none)
    disk: LinkModel | None = None  # each node's disk reads, real bytes (the engine's drives)

    @staticmethod
    def from_e2e(config: E2EConfig, nodes: int | None = None, speed: float = 1.0,
                 predictor: str = "builtin", host_pages: int | None = None,
                 disk_pages: int | None = None) -> "SimSettings":
        """host_pages: each node's host tier instead of the configuration's
        (None: the configuration's); the retention cap follows it.
        disk_pages likewise for the disk tier (read at the configuration's
        disk profile)."""
        return SimSettings(nodes=nodes or config.nodes, sizes=config.node_sizes(host_pages),
                           heartbeat_s=config.heartbeat_interval_s * speed, tick_s=config.scheduler_tick_s * speed,
                           forecast_poll_s=config.forecast_poll_s * speed,
                           forecast_horizon_s=config.forecast_horizon_s * speed, warmup_s=config.warmup_s,
                           predictor=predictor,
                           disk_pages=config.disk_pages if disk_pages is None else disk_pages, disk=config.disk)

    def with_nodes(self, nodes: int) -> "SimSettings":
        return replace(self, nodes=nodes)
