"""The memory tiers a node keeps KV in, named once for every service.

DEVICE is the engine's HBM (what prefill reads); HOST is DRAM below it,
reached over the host link (PCIe). A block may be in either tier or both;
KV events name the tier with vLLM's medium strings ("GPU", "CPU"), so an
event without a medium is a device event, as it was before tiers existed.
"""
from __future__ import annotations

import enum

from speckv.services.common.errors import InvalidArgument


class Tier(enum.Enum):
    DEVICE = "GPU"
    HOST = "CPU"

    @property
    def medium(self) -> str:
        """The KV-event medium string (vLLM's BlockStored.medium)."""
        return self.value

    @staticmethod
    def parse(name: str) -> Tier:
        """A tier from a medium ("GPU"/"CPU") or a tier name ("device"/"host"),
        any case; "" is the device. InvalidArgument names the choices."""
        key = name.strip().upper()
        if key in ("", "GPU", "DEVICE"):
            return Tier.DEVICE
        if key in ("CPU", "HOST"):
            return Tier.HOST
        raise InvalidArgument(f"tier {name!r} is unknown; expected one of device (GPU), host (CPU)")
