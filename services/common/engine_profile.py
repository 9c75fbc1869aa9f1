"""How long an engine takes to prefill, and a link to move KV: the two cost
models behind the router's expected TTFT.

Prefill (milliseconds), for `new` uncached tokens after `cached` cached ones:
    prefill_ms = overhead_ms + ms_per_token * new
                 + ms_per_token_pair * (new * cached + new * (new + 1) / 2)
The last term is causal attention: each new token attends to every cached
token and to the new tokens before it. A fully cached prompt still computes
its last token (the engine needs its logits), so `new` is at least 1.

Queueing (milliseconds) for work already waiting on a node:
    queue_ms = ms_per_token * queued_tokens + overhead_ms * waiting_requests

Transfer (milliseconds) of n bytes over one link:
    transfer_ms = link_overhead_ms + n * 8 / (link_gbps * 1e9) * 1e3

Profiles live in services/config/engine_profiles.json; each says where its
numbers come from, and one without a `source` is refused at load. A profile
fitted to published measurements (`measured`: true, `speckv profile fit`)
also carries its `provenance`: the files and commit it was fitted from, how
they were scaled, the held-out error and the attention source. An engine with
tensor parallelism spans `tensor_parallel` GPUs; its costs are the whole
engine's, and each of its GPUs has its own link (links.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from speckv.services.common.config import CONFIG_DIR
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry

DEFAULT_PROFILES_PATH = CONFIG_DIR / "engine_profiles.json"


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One engine's prefill cost (formula above): times in ms of the whole
    engine, token counts in tokens. Invariants (checked at load): ms_per_token
    > 0, overhead_ms and ms_per_token_pair >= 0, tensor_parallel >= 1."""

    name: str
    model: str
    hardware: str
    overhead_ms: float
    ms_per_token: float
    ms_per_token_pair: float
    geometry: KVGeometry
    measured: bool = False
    source: str = ""
    tensor_parallel: int = 1  # GPUs one engine spans (each with its own NIC and PCIe link)

    def prefill_ms(self, new_tokens: int, cached_tokens: int = 0) -> float:
        new = max(1, new_tokens)
        cached = max(0, cached_tokens)
        pairs = new * cached + new * (new + 1) / 2
        return self.overhead_ms + self.ms_per_token * new + self.ms_per_token_pair * pairs

    def queue_ms(self, queued_tokens: int, waiting_requests: int) -> float:
        return self.ms_per_token * max(0, queued_tokens) + self.overhead_ms * max(0, waiting_requests)

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 / self.ms_per_token


@dataclass(frozen=True, slots=True)
class LinkModel:
    """One node-to-node link: bandwidth in Gbit/s and a per-transfer overhead."""

    gbps: float
    overhead_ms: float = 1.0

    def transfer_ms(self, nbytes: int) -> float:
        return self.overhead_ms + nbytes * 8.0 / (self.gbps * 1e9) * 1e3


def load_profiles(path: Path | str | None = None) -> dict[str, EngineProfile]:
    source = Path(path) if path else DEFAULT_PROFILES_PATH
    try:
        raw = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"engine profiles {source}: {exc}") from None
    return {name: _profile(name, spec, source) for name, spec in raw.get("profiles", {}).items()}


def get_profile(name: str, path: Path | str | None = None) -> EngineProfile:
    profiles = load_profiles(path)
    if name not in profiles:
        raise InvalidArgument(
            f"engine_profile={name!r} is unknown; available: {', '.join(sorted(profiles))}")
    return profiles[name]


# What a fitted profile's provenance must name, so that anyone can redo the fit.
PROVENANCE_KEYS = ("files", "commit", "scaling", "held_out_error", "attention")


def _profile(name: str, spec: dict, source: Path) -> EngineProfile:
    where = f"engine profile {name!r} in {source}"
    try:
        profile = EngineProfile(
            name=name, model=str(spec["model"]), hardware=str(spec.get("hardware", "")),
            overhead_ms=float(spec["overhead_ms"]), ms_per_token=float(spec["ms_per_token"]),
            ms_per_token_pair=float(spec.get("ms_per_token_pair", 0.0)),
            geometry=KVGeometry(name=str(spec["model"]), **spec["geometry"]),
            measured=bool(spec.get("measured", False)), source=str(spec.get("source", "")),
            tensor_parallel=int(spec.get("tensor_parallel", 1)))
    except (KeyError, TypeError, ValueError, InvalidArgument) as exc:
        raise InvalidArgument(f"{where}: bad or missing field ({exc})") from None
    if profile.ms_per_token <= 0 or profile.overhead_ms < 0 or profile.ms_per_token_pair < 0:
        raise InvalidArgument(f"{where}: costs must be >= 0 (ms_per_token > 0)")
    if profile.tensor_parallel < 1:
        raise InvalidArgument(f"{where}: tensor_parallel must be >= 1")
    if not profile.source.strip():
        raise InvalidArgument(f"{where} has no source: every profile must say where its figures come from "
                              "(a citation, or 'Approximate. ...' with the assumptions)")
    if profile.measured:
        provenance = spec.get("provenance")
        missing = [key for key in PROVENANCE_KEYS
                   if not isinstance(provenance, dict) or not provenance.get(key)]
        if missing:
            raise InvalidArgument(f"{where} is marked measured but its provenance lacks "
                                  f"{', '.join(missing)}: a fitted profile names its source files, commit, "
                                  "scaling, held-out error and attention source")
    return profile
