"""The committed end-to-end configuration (services/config/e2e.json), loaded
into typed records.

Invariants: every policy of one comparison runs on the same E2EConfig; the
byte scale factor is derived from the two geometries (real model bytes per
token / kvstore bytes per token), never configured, and every link bandwidth
handed to a service that moves scaled bytes is divided by it. The node link
is named (cluster.link, a profile of services/config/links.json: one GPU's
link, times the engine profile's GPUs); older files that give link_gbps and
link_overhead_ms instead still load.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from speckv.loadgen.engines.emulated import EngineLimits
from speckv.services.common.config import CONFIG_DIR
from speckv.services.common.disks import get_disk
from speckv.services.common.engine_profile import EngineProfile, LinkModel, get_profile
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry, preset
from speckv.services.common.links import get_link
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.traces.mooncake import FAMILY_MODES

DEFAULT_E2E_PATH = CONFIG_DIR / "e2e.json"


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """A slice of trace time, [start_s, start_s + duration_s), replayed `speed` x faster."""

    start_s: float
    duration_s: float
    speed: float


@dataclass(frozen=True, slots=True)
class E2EConfig:
    profile: EngineProfile
    real_geometry: KVGeometry  # the model's KV at block_tokens per block
    store_geometry: str  # kvstore preset holding the scaled bytes
    block_tokens: int
    nodes: int
    pool_pages: int
    link: LinkModel  # the real link, real bytes
    heartbeat_interval_s: float
    ttft_target_ms: float
    scheduler_tick_s: float
    engine: EngineLimits
    slices: dict[str, SliceSpec]
    warmup_s: float
    forecast_horizon_s: float
    forecast_poll_s: float
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    warm_kv_fraction: float = 0.9  # share of the cluster's device pages the warm start fills with pre-slice KV
    host_pages: int = 0  # each node's host tier, blocks (0: none)
    host_link: LinkModel | None = None  # each node's host<->device link, real bytes (None: no host tier)
    retain_max_share: float = 0.0  # share of each node's last tier retain orders may hold at once
    disk_pages: int = 0  # each node's disk tier, blocks (0: none)
    disk: LinkModel | None = None  # each node's disk reads (cluster.disk, a disks.json profile; nvme-gen4 if unnamed)
    family: str = "prefix"  # how trace requests are keyed into families (loadgen.traces.mooncake.FAMILY_MODES)

    def node_sizes(self, host_pages: int | None = None) -> NodeSizes:
        """Each node's sizes: pool_pages of device tier, host_pages of host
        tier (the argument, else the file's), and a retention cap of
        retain_max_share of the last tier, as a kvstore sizes its own."""
        host = self.host_pages if host_pages is None else host_pages
        return NodeSizes.with_retain_share(self.pool_pages, host, self.retain_max_share)

    @property
    def scaled_geometry(self) -> KVGeometry:
        return preset(self.store_geometry, self.block_tokens)

    @property
    def byte_scale(self) -> int:
        """Real bytes per stored byte (e.g. 1024)."""
        return self.real_geometry.bytes_per_token // self.scaled_geometry.bytes_per_token

    @property
    def real_bytes_per_block(self) -> int:
        return self.real_geometry.bytes_per_block

    def scaled_link_gbps(self, speed: float = 1.0) -> float:
        """Bandwidth for a service moving scaled bytes: real / byte_scale,
        times the replay's compression when it acts on the wall clock."""
        return self.link.gbps / self.byte_scale * speed


def load_e2e_config(path: Path | str | None = None) -> E2EConfig:
    source = Path(path) if path else DEFAULT_E2E_PATH
    try:
        raw = json.loads(source.read_text())
        model, cluster, engine, slices = raw["model"], raw["cluster"], raw["engine"], raw["slices"]
        profile = get_profile(model["engine_profile"])
        block_tokens = int(model["block_tokens"])
        config = E2EConfig(
            profile=profile, real_geometry=preset(model["kv_bytes_geometry"], block_tokens),
            store_geometry=str(raw["scaled_kv"]["kvstore_geometry"]), block_tokens=block_tokens,
            nodes=int(cluster["nodes"]), pool_pages=int(cluster["pool_pages"]),
            link=_node_link(cluster, profile, source),
            heartbeat_interval_s=float(cluster["heartbeat_interval_s"]),
            ttft_target_ms=float(cluster["ttft_target_ms"]), scheduler_tick_s=float(cluster["scheduler_tick_s"]),
            engine=EngineLimits(int(engine["max_batched_tokens"]), int(engine["max_num_seqs"]),
                                float(engine["decode_weights_ms"]), float(engine["hbm_gb_per_s"]),
                                float(engine["decode_step_overhead_ms"])),
            slices={name: SliceSpec(float(s["start_s"]), float(s["duration_s"]), float(s["speed"]))
                    for name, s in slices.items() if isinstance(s, dict)},
            warmup_s=float(slices["warmup_s"]),
            forecast_horizon_s=float(raw["predictor"]["forecast_horizon_s"]),
            forecast_poll_s=float(raw["predictor"]["forecast_poll_s"]),
            extra_args={k: [str(a) for a in v] for k, v in cluster.get("extra_args", {}).items()},
            family=str(model.get("family", "prefix")),
            host_pages=int(cluster.get("host_pages", 0)),
            retain_max_share=float(cluster.get("retain_max_share", 0.0)),
            host_link=(LinkModel(float(cluster["host_link_gbps"]), float(cluster.get("host_link_overhead_ms", 0.0)))
                       if "host_link_gbps" in cluster else None),
            warm_kv_fraction=float(slices.get("warm_kv_fraction", 0.9)),
            disk_pages=int(cluster.get("disk_pages", 0)), disk=_disk(cluster, profile, source))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(f"e2e config {source}: bad or missing field ({exc})") from None
    _validate(config, source)
    return config


def _node_link(cluster: dict, profile: EngineProfile, source: Path) -> LinkModel:
    """The real node-to-node link: the named profile for an engine of
    profile.tensor_parallel GPUs, or the figures themselves in older files."""
    if "link" not in cluster:
        return LinkModel(float(cluster["link_gbps"]), float(cluster["link_overhead_ms"]))
    if "link_gbps" in cluster or "link_overhead_ms" in cluster:
        raise InvalidArgument(f"e2e config {source}: cluster.link names a link profile; drop cluster.link_gbps "
                              "and cluster.link_overhead_ms (the profile has them)")
    try:
        return get_link(str(cluster["link"])).model(profile.tensor_parallel)
    except InvalidArgument as exc:
        raise InvalidArgument(f"e2e config {source}: cluster.link: {exc}") from None


def _disk(cluster: dict, profile: EngineProfile, source: Path) -> LinkModel:
    """Each node's disk reads: the named disks.json profile (default
    nvme-gen4) for an engine of profile.tensor_parallel GPUs."""
    try:
        return get_disk(str(cluster.get("disk", "nvme-gen4"))).model(profile.tensor_parallel)
    except InvalidArgument as exc:
        raise InvalidArgument(f"e2e config {source}: cluster.disk: {exc}") from None


def _validate(config: E2EConfig, source: Path) -> None:
    if config.nodes <= 0 or config.pool_pages <= 0:
        raise InvalidArgument(f"e2e config {source}: cluster.nodes and cluster.pool_pages must be > 0")
    if config.host_pages < 0:
        raise InvalidArgument(f"e2e config {source}: cluster.host_pages must be >= 0 (0: no host tier)")
    if config.disk_pages < 0 or (config.disk_pages and not config.host_pages):
        raise InvalidArgument(f"e2e config {source}: cluster.disk_pages must be >= 0 and needs a host tier")
    if not 0.0 <= config.retain_max_share < 1.0:
        raise InvalidArgument(f"e2e config {source}: cluster.retain_max_share must be in [0, 1)")
    if config.host_pages and (config.host_link is None or config.host_link.gbps <= 0):
        raise InvalidArgument(f"e2e config {source}: a host tier (cluster.host_pages > 0) needs "
                              "cluster.host_link_gbps > 0")
    if config.real_geometry.bytes_per_token % config.scaled_geometry.bytes_per_token:
        raise InvalidArgument(f"e2e config {source}: real bytes per token must be a multiple of the kvstore's")
    if config.engine.max_batched_tokens <= 0 or config.engine.max_num_seqs <= 0:
        raise InvalidArgument(f"e2e config {source}: engine.max_batched_tokens and max_num_seqs must be > 0")
    if not 0 <= config.warm_kv_fraction <= 1:
        raise InvalidArgument(f"e2e config {source}: slices.warm_kv_fraction must be in [0, 1]")
    if config.family not in FAMILY_MODES:
        raise InvalidArgument(f"e2e config {source}: model.family={config.family!r}: expected one of "
                              f"{', '.join(FAMILY_MODES)}")
    for name, s in config.slices.items():
        if s.duration_s <= 0 or s.speed <= 0 or s.start_s < 0:
            raise InvalidArgument(f"e2e config {source}: slices.{name} needs start_s >= 0, duration_s > 0, speed > 0")
