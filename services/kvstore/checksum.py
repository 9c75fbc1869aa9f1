"""CRC32C (Castagnoli) of replication chunks and served blocks.

google-crc32c's C extension only accepts `bytes`; other buffers are copied
once into bytes first (the gRPC path already holds bytes, so it never copies).
"""
from __future__ import annotations

import google_crc32c
import numpy as np


def crc32c(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    if not isinstance(data, bytes):
        data = bytes(data.reshape(-1).view(np.uint8)) if isinstance(data, np.ndarray) else bytes(data)
    return google_crc32c.value(data)
