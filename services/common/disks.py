"""Named disk profiles (services/config/disks.json) for the kvstore's disk
tier, each figure with its source.

A profile is one drive's sequential read rate (GB/s, 10^9 bytes per
second), the share of it the tier's checked reads achieve, how many drives
one GPU has, and a fixed cost per load (ms). An engine of `tensor_parallel`
GPUs reads its KV from that many GPUs' drives at once, so

    gbytes_s    = read_gbytes_s * effective_fraction * drives_per_gpu  (one GPU)
    model(gpus) = LinkModel(gbytes_s * 8 * gpus, overhead_ms)          (one engine, Gbit/s)

A disk load ends in the host tier; the block then crosses the host link
like a host hit, so a disk load's whole path is `serial(disk, host_link)`.

Invariants, checked at load: read_gbytes_s > 0, 0 < effective_fraction <= 1,
drives_per_gpu >= 1, overhead_ms >= 0, and every figure names its source.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from speckv.services.common.config import CONFIG_DIR
from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.sourced import load_section, sources_of

DEFAULT_DISKS_PATH = CONFIG_DIR / "disks.json"
SOURCED_FIELDS = ("read_gbytes_s", "effective_fraction", "drives_per_gpu", "overhead_ms")


@dataclass(frozen=True, slots=True)
class DiskProfile:
    """One GPU's disk: drives of read_gbytes_s (GB/s) each, the share of it
    the checked reads achieve, drives per GPU, and ms per load."""

    name: str
    read_gbytes_s: float
    effective_fraction: float
    drives_per_gpu: int
    overhead_ms: float
    about: str = ""
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def gbytes_s(self) -> float:
        """Effective read rate of one GPU's drives, GB/s."""
        return self.read_gbytes_s * self.effective_fraction * self.drives_per_gpu

    def model(self, gpus: int = 1) -> LinkModel:
        """The disk of an engine spanning `gpus` GPUs (>= 1), as a link (Gbit/s)."""
        if gpus < 1:
            raise InvalidArgument(f"disk {self.name!r}: an engine spans at least one GPU (got {gpus})")
        return LinkModel(self.gbytes_s * 8.0 * gpus, self.overhead_ms)


def serial(first: LinkModel, then: LinkModel) -> LinkModel:
    """Two copies one after the other (disk -> host, host -> device) as one
    link: the overheads add and so do the times per byte, exactly."""
    return LinkModel(1.0 / (1.0 / first.gbps + 1.0 / then.gbps), first.overhead_ms + then.overhead_ms)


def load_disks(path: Path | str | None = None) -> dict[str, DiskProfile]:
    source = Path(path) if path else DEFAULT_DISKS_PATH
    disks = load_section(source, "disks", "disk profiles")
    return {name: _disk(name, spec, source) for name, spec in disks.items()}


def get_disk(name: str, path: Path | str | None = None) -> DiskProfile:
    disks = load_disks(path)
    if name not in disks:
        raise InvalidArgument(f"disk={name!r} is unknown; available: {', '.join(sorted(disks))}")
    return disks[name]


def _disk(name: str, spec: object, source: Path) -> DiskProfile:
    where = f"disk {name!r} in {source}"
    sources = sources_of(where, spec, SOURCED_FIELDS, "a citation, a measurement, or 'ASSUMPTION: ...'")
    assert isinstance(spec, dict)  # sources_of refused anything else
    try:
        disk = DiskProfile(name=name, read_gbytes_s=float(spec["read_gbytes_s"]),
                           effective_fraction=float(spec["effective_fraction"]),
                           drives_per_gpu=int(spec["drives_per_gpu"]), overhead_ms=float(spec["overhead_ms"]),
                           about=str(spec.get("about", "")), sources=sources)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"{where}: bad or missing field ({exc})") from None
    if (disk.read_gbytes_s <= 0 or not 0 < disk.effective_fraction <= 1 or disk.drives_per_gpu < 1
            or disk.overhead_ms < 0):
        raise InvalidArgument(f"{where}: needs read_gbytes_s > 0, 0 < effective_fraction <= 1, "
                              "drives_per_gpu >= 1, overhead_ms >= 0")
    return disk
