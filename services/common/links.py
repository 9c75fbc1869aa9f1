"""Named node-to-node link profiles (services/config/links.json), each figure
with its source.

A profile is one GPU's share of the network: a speckv node is one engine, and
an engine of `tensor_parallel` GPUs moves its KV over that many links at once
(each rank sends its own KV heads over its own NIC, as on a DGX H100 with one
ConnectX-7 per GPU). So

    gbps        = line_gbps * effective_fraction          (one GPU, Gbit/s)
    model(gpus) = LinkModel(gbps * gpus, overhead_ms)     (one engine)

Invariants, checked at load: line_gbps > 0, 0 < effective_fraction <= 1,
overhead_ms >= 0, and every one of the three figures names its source; a
profile without one is refused with an error naming the file, the profile
and the figure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from speckv.services.common.config import CONFIG_DIR
from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.sourced import load_section, sources_of

DEFAULT_LINKS_PATH = CONFIG_DIR / "links.json"
# The figures a profile states; each needs an entry in its `sources`.
SOURCED_FIELDS = ("line_gbps", "effective_fraction", "overhead_ms")


@dataclass(frozen=True, slots=True)
class LinkProfile:
    """One GPU's link: line rate (Gbit/s), the share of it a bulk KV transfer
    achieves, and a fixed cost per transfer (ms). `sources` maps each of
    SOURCED_FIELDS to where the figure comes from."""

    name: str
    line_gbps: float
    effective_fraction: float
    overhead_ms: float
    about: str = ""
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        """Effective bandwidth of one GPU's link, Gbit/s."""
        return self.line_gbps * self.effective_fraction

    def model(self, gpus: int = 1) -> LinkModel:
        """The link of an engine spanning `gpus` GPUs (>= 1), one NIC each."""
        if gpus < 1:
            raise InvalidArgument(f"link {self.name!r}: an engine spans at least one GPU (got {gpus})")
        return LinkModel(self.gbps * gpus, self.overhead_ms)


def load_links(path: Path | str | None = None) -> dict[str, LinkProfile]:
    source = Path(path) if path else DEFAULT_LINKS_PATH
    links = load_section(source, "links", "link profiles")
    return {name: _link(name, spec, source) for name, spec in links.items()}


def get_link(name: str, path: Path | str | None = None) -> LinkProfile:
    links = load_links(path)
    if name not in links:
        raise InvalidArgument(f"link={name!r} is unknown; available: {', '.join(sorted(links))}")
    return links[name]


def _link(name: str, spec: object, source: Path) -> LinkProfile:
    where = f"link {name!r} in {source}"
    sources = sources_of(where, spec, SOURCED_FIELDS, "a citation, or 'ASSUMPTION: ...' with the reasoning")
    assert isinstance(spec, dict)  # sources_of refused anything else
    try:
        link = LinkProfile(name=name, line_gbps=float(spec["line_gbps"]),
                           effective_fraction=float(spec["effective_fraction"]),
                           overhead_ms=float(spec["overhead_ms"]), about=str(spec.get("about", "")),
                           sources=sources)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"{where}: bad or missing field ({exc})") from None
    if link.line_gbps <= 0 or not 0 < link.effective_fraction <= 1 or link.overhead_ms < 0:
        raise InvalidArgument(f"{where}: needs line_gbps > 0, 0 < effective_fraction <= 1, overhead_ms >= 0")
    return link
