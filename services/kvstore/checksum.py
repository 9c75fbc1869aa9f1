"""CRC32C (Castagnoli) of replication chunks and served blocks.

google-crc32c's C extension takes `bytes` and NumPy arrays, but refuses
memoryview and bytearray; those are viewed as a NumPy array first (no copy),
so a chunk is checksummed where it lies (staging buffer, pool view). Hardware
crc32c runs at ~15 GB/s here, so it is not the data plane's bottleneck.
"""
from __future__ import annotations

import google_crc32c
import numpy as np


def crc32c(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    if isinstance(data, bytes):
        return google_crc32c.value(data)
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise ValueError("crc32c needs a C-contiguous array")
        return google_crc32c.value(data.reshape(-1).view(np.uint8))
    return google_crc32c.value(np.frombuffer(data, dtype=np.uint8))
