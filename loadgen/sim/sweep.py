"""`speckv simulate --sweep KEY=V1,V2,...`: the cells of a regime map and the
configuration each one runs on.

    --sweep link=tcp-25g,eth-100g,rdma-400g --sweep profile=llama-3-8b-h100-vidur,llama-2-70b-h100-tp4-vidur

A cell is one value per swept key; the cells are the cartesian product of
the sweeps, in the order given (the first --sweep outermost). Every cell runs
every policy at every node count, all on the one process pool.

Invariants:
- A cell's configuration is the base configuration (e2e.json, or --config)
  with its swept keys replaced, and nothing else: `resolved_view` of two cells
  that differ in one key differs in that key's entry alone.
- A key brings along what its value implies, never more. `link` names a
  profile of services/config/links.json: one GPU's link, times the engine's
  GPUs. `profile` names an engine profile of services/config/engine_profiles.json,
  and with it the model: the KV geometry (bytes per token, at the
  configuration's block_tokens), the decode step (the profile's fitted decode
  when it has one), the HBM bandwidth its KV reads use (its GPU's, times its
  GPUs), and, for an engine of N tensor-parallel GPUs, N node links and N
  host links (each rank moves its own KV heads over its own NIC and PCIe
  link, as `speckv cost` prices them).
- Pool sizes stay in blocks (tokens), so every cell caches as many tokens per
  node and the map compares costs, not capacities; the bytes those blocks
  hold follow the model.
- Everything is resolved, and every bad key or value refused
  (InvalidArgument), in the command's process before any worker starts.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from speckv.loadgen.engines.emulated import EngineLimits
from speckv.loadgen.experiments.e2e_config import DEFAULT_E2E_PATH, E2EConfig, load_e2e_config
from speckv.services.common.engine_profile import DEFAULT_PROFILES_PATH, LinkModel, get_profile, load_profiles
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.links import get_link, load_links

SWEEP_KEYS = ("link", "profile")

# A cell as a Job carries it: ((key, value), ...) in SWEEP order; () is the base.
CellKey = tuple[tuple[str, str], ...]

# HBM bandwidth of one GPU, GB/s, by the name in a profile's `hardware`: what
# a decode step's KV reads run at (the emulated engine's hbm_gb_per_s, times
# the engine's GPUs). The most specific name is tried first.
HBM_GB_PER_S: tuple[tuple[str, float, str], ...] = (
    ("H200", 4800.0, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
    ("H100", 3350.0, "NVIDIA H100 datasheet: 3.35 TB/s HBM3 (SXM)"),
    ("A100", 2039.0, "NVIDIA A100 datasheet: 2,039 GB/s HBM2e (80GB SXM)"),
)


@dataclass(frozen=True, slots=True)
class Sweep:
    """One --sweep: a key of SWEEP_KEYS and its values (distinct, in the order given)."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Cell:
    """One cell of the map: its key (what a Job carries), its resolved
    configuration, and where each figure of that configuration came from."""

    key: CellKey
    config: E2EConfig
    view: dict[str, dict[str, object]]  # resolved_view(config, ...): JSON-ready

    @property
    def label(self) -> str:
        return cell_label(self.key)

    def value(self, key: str) -> str:
        return str(self.view[key]["name"])


def cell_label(key: CellKey) -> str:
    """"tcp-25g / llama-3-8b-h100" (values in SWEEP_KEYS order); "base" for ()."""
    return " / ".join(v for _, v in key) if key else "base"


def parse_sweeps(specs: Sequence[str]) -> list[Sweep]:
    """--sweep KEY=V1,V2 arguments, validated for form (values are checked
    against the configuration files by resolve_cells)."""
    sweeps: list[Sweep] = []
    for spec in specs:
        key, sep, rest = spec.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidArgument(f"--sweep {spec!r}: expected KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}")
        if key not in SWEEP_KEYS:
            raise InvalidArgument(f"--sweep {spec!r}: unknown key {key!r}; sweepable keys: {', '.join(SWEEP_KEYS)}")
        if any(s.key == key for s in sweeps):
            raise InvalidArgument(f"--sweep {key}=... given twice: list all its values in one --sweep")
        values = tuple(v.strip() for v in rest.split(","))
        if not values or any(not v for v in values):
            raise InvalidArgument(f"--sweep {spec!r}: expected a comma-separated list of values, none empty")
        if len(set(values)) != len(values):
            raise InvalidArgument(f"--sweep {spec!r}: name each value once")
        sweeps.append(Sweep(key, values))
    return sweeps


def cell_keys(sweeps: Sequence[Sweep]) -> list[CellKey]:
    """The cartesian product of the sweeps, the first sweep outermost; each
    cell's pairs in SWEEP_KEYS order so that a cell has one spelling."""
    keys: list[CellKey] = []
    for combo in itertools.product(*[[(s.key, v) for v in s.values] for s in sweeps]):
        keys.append(tuple(sorted(combo, key=lambda kv: SWEEP_KEYS.index(kv[0]))))
    return keys


def resolve_cells(sweeps: Sequence[Sweep], config_path: str | None = None) -> list[Cell]:
    """Every cell's configuration, resolved now: an unknown link or profile,
    or a profile whose decode cost cannot be derived, is an InvalidArgument
    naming the choices."""
    _check_values(sweeps)
    base = load_e2e_config(config_path)
    names = base_names(config_path)
    return [Cell(k, config, resolved_view(config, dict(names, **dict(k))))
            for k in cell_keys(sweeps) for config in [resolve(base, names, k)]]


def cell_config(config_path: str | None, key: CellKey) -> E2EConfig:
    """What a worker runs on: the base configuration, or the cell's."""
    base = load_e2e_config(config_path)
    return resolve(base, base_names(config_path), key) if key else base


def base_names(config_path: str | None) -> dict[str, str]:
    """The base configuration's link and profile names ("" for a link given
    as bare figures, as older files do)."""
    source = Path(config_path) if config_path else DEFAULT_E2E_PATH
    raw = json.loads(source.read_text())  # load_e2e_config has already read and checked it
    return {"link": str(raw["cluster"].get("link", "")), "profile": str(raw["model"]["engine_profile"])}


def resolve(base: E2EConfig, names: dict[str, str], key: CellKey) -> E2EConfig:
    """The base configuration with the cell's keys replaced (module invariants)."""
    chosen = dict(names, **dict(key))
    profile = get_profile(chosen["profile"]) if chosen["profile"] != base.profile.name else base.profile
    gpus, base_gpus = profile.tensor_parallel, base.profile.tensor_parallel
    if chosen["link"]:
        link = get_link(chosen["link"]).model(gpus)
    else:  # an older file's bare figures: one engine's link, so per GPU divide by its GPUs
        link = LinkModel(base.link.gbps / base_gpus * gpus, base.link.overhead_ms)
    host = base.host_link
    if host is not None:
        host = LinkModel(host.gbps / base_gpus * gpus, host.overhead_ms)
    if base.real_geometry.bytes_per_token % base.scaled_geometry.bytes_per_token or \
            profile.geometry.bytes_per_token % base.scaled_geometry.bytes_per_token:
        raise InvalidArgument(f"--sweep profile={profile.name}: its KV bytes per token must be a multiple of the "
                              f"kvstore geometry's ({base.store_geometry})")
    if profile == base.profile:  # the base's own figures, even where its file states them apart from the profile
        return replace(base, link=link, host_link=host)
    return replace(base, profile=profile, real_geometry=profile.geometry.with_block_size(base.block_tokens),
                   link=link, host_link=host, engine=_engine_for(profile.name, profile.model, profile.hardware,
                                                                 gpus, base))


def _engine_for(name: str, model: str, hardware: str, gpus: int, base: E2EConfig) -> EngineLimits:
    """The engine's decode figures under another profile: its fitted decode
    step when it has one (the profile's `decode.step_ms`: every layer's
    operators and the LM head; the configuration's per-step overhead stays
    on top, as for the base), else the base's when it is the same model;
    KV reads at its GPU's HBM bandwidth times its GPUs."""
    decode = load_decode_fits().get(name)
    if decode is None:
        if model != base.profile.model:
            raise InvalidArgument(
                f"--sweep profile={name}: it has no fitted decode step ('decode' in engine_profiles.json) and "
                f"its model ({model}) is not the configuration's ({base.profile.model}), so its decode cost "
                "cannot be derived; sweep a fitted profile (speckv profile fit) instead")
        weights_ms = base.engine.decode_weights_ms
    else:
        weights_ms = decode
    return replace(base.engine, decode_weights_ms=weights_ms, hbm_gb_per_s=hbm_gb_per_s(name, hardware) * gpus)


def load_decode_fits(path: Path | str | None = None) -> dict[str, float]:
    """Profile name -> its fitted decode step, ms (profiles with a `decode`
    entry only; EngineProfile does not carry it)."""
    raw = json.loads(Path(path or DEFAULT_PROFILES_PATH).read_text()).get("profiles", {})
    return {name: float(spec["decode"]["step_ms"]) for name, spec in raw.items()
            if isinstance(spec, dict) and isinstance(spec.get("decode"), dict) and "step_ms" in spec["decode"]}


def hbm_gb_per_s(name: str, hardware: str) -> float:
    """One GPU's HBM bandwidth for a profile's hardware (HBM_GB_PER_S)."""
    for gpu, gb_per_s, _ in HBM_GB_PER_S:
        if gpu in hardware:
            return gb_per_s
    raise InvalidArgument(f"--sweep profile={name}: its hardware ({hardware!r}) names none of "
                          f"{', '.join(g for g, _, _ in HBM_GB_PER_S)}, so its HBM bandwidth is unknown")


def resolved_view(config: E2EConfig, names: dict[str, str]) -> dict[str, dict[str, object]]:
    """The figures a simulation reads, grouped by the key that decides them
    (per GPU where a key's figure is per GPU, so a profile's GPU count shows
    under `profile` alone). Built from the resolved configuration itself, so
    a figure that failed to follow its key shows as a difference elsewhere."""
    gpus = config.profile.tensor_parallel
    p, e = config.profile, config.engine
    return {
        "link": {"name": names["link"] or "(figures in the config file)", "gbps_per_gpu": config.link.gbps / gpus,
                 "overhead_ms": config.link.overhead_ms},
        "profile": {"name": p.name, "model": p.model, "hardware": p.hardware, "tensor_parallel": gpus,
                    "measured": p.measured, "overhead_ms": p.overhead_ms, "ms_per_token": p.ms_per_token,
                    "ms_per_token_pair": p.ms_per_token_pair,
                    "kv_bytes_per_token": config.real_geometry.bytes_per_token,
                    "kv_layers_heads_dim": [config.real_geometry.num_layers, config.real_geometry.num_kv_heads,
                                            config.real_geometry.head_dim],
                    "decode_weights_ms": e.decode_weights_ms, "hbm_gb_per_s_per_gpu": e.hbm_gb_per_s / gpus},
        "cluster": {"nodes": config.nodes, "block_tokens": config.block_tokens, "pool_pages": config.pool_pages,
                    "host_pages": config.host_pages, "retain_max_share": config.retain_max_share,
                    "host_link_gbps_per_gpu": config.host_link.gbps / gpus if config.host_link else None,
                    "host_link_overhead_ms": config.host_link.overhead_ms if config.host_link else None,
                    "heartbeat_interval_s": config.heartbeat_interval_s, "ttft_target_ms": config.ttft_target_ms,
                    "scheduler_tick_s": config.scheduler_tick_s, "family": config.family,
                    "store_geometry": config.store_geometry, "warm_kv_fraction": config.warm_kv_fraction},
        "engine": {"max_batched_tokens": e.max_batched_tokens, "max_num_seqs": e.max_num_seqs,
                   "decode_step_overhead_ms": e.decode_step_overhead_ms},
        "predictor": {"forecast_horizon_s": config.forecast_horizon_s, "forecast_poll_s": config.forecast_poll_s,
                      "warmup_s": config.warmup_s},
    }


def _check_values(sweeps: Sequence[Sweep]) -> None:
    for s in sweeps:
        available: dict[str, object] = dict(load_links() if s.key == "link" else load_profiles())
        unknown = [v for v in s.values if v not in available]
        if unknown:
            raise InvalidArgument(f"--sweep {s.key}: unknown {', '.join(map(repr, unknown))}; available: "
                                  f"{', '.join(sorted(available))}")
