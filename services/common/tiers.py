"""The memory tiers a node keeps KV in, named once for every service.

DEVICE is the engine's HBM (what prefill reads); HOST is DRAM below it,
reached over the host link (PCIe); DISK is a local filesystem below the
host tier (services/kvstore/disk/, docs/disk.md). A block may be in any of
them at once. KV events name the tier by a medium string: vLLM's own
("GPU", "CPU") for the two memory tiers and "STORAGE" for the disk, the
name Dynamo's KV event mapping gives a storage tier (vLLM's events have no
disk medium). An event without a medium is a device event, as it was
before tiers existed.
"""
from __future__ import annotations

import enum

from speckv.services.common.errors import InvalidArgument


class Tier(enum.Enum):
    DEVICE = "GPU"
    HOST = "CPU"
    DISK = "STORAGE"

    @property
    def medium(self) -> str:
        """The KV-event medium string (vLLM's BlockStored.medium; STORAGE: Dynamo's)."""
        return self.value

    @staticmethod
    def parse(name: str) -> Tier:
        """A tier from a medium ("GPU"/"CPU"/"STORAGE") or a tier name
        ("device"/"host"/"disk"), any case; "" is the device.
        InvalidArgument names the choices."""
        key = name.strip().upper()
        if key in ("", "GPU", "DEVICE"):
            return Tier.DEVICE
        if key in ("CPU", "HOST"):
            return Tier.HOST
        if key in ("STORAGE", "DISK"):
            return Tier.DISK
        raise InvalidArgument(f"tier {name!r} is unknown; expected one of device (GPU), host (CPU), disk (STORAGE)")
