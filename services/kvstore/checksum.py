"""CRC32C (Castagnoli) of replication chunks and served blocks, and the
combination of checksums of adjacent byte ranges.

The `crc32c` package (ICRAR's, hardware CRC32C instructions) takes any
contiguous buffer (bytes, memoryviews, NumPy arrays), so a chunk is
checksummed where it lies (staging buffer, pool view), and it releases the
GIL on buffers of 32 KiB and more, so checks on several threads (the TCP
receiver's checking thread, the disk reader's, the engine's saves) run at
once; google-crc32c, used before, held the GIL throughout and was about
1.5x slower on cold memory here (docs/journal/dataplane.md, 2026-12-06).
Cold pool memory still checksums several times slower than a piece hot in
cache; that gap is why the data plane checksums segments right after they
land and keeps segment checksums instead of re-reading cold pages.

combine(crc_a, crc_b, len_b) = crc32c(a + b) without reading a or b: the
zlib crc32_combine algorithm (multiplication by x^(8 len_b) modulo the
polynomial, in GF(2)), hand-written because no installed library exposes it
for CRC32C. The shift by a given length is a linear map of the 32-bit
register; it is built once per length (~1 ms) into four 256-entry tables, so
a combine costs four lookups and three xors (~0.5 us in Python).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Iterable

import crc32c as _crc32c
import numpy as np

POLY = 0x82F63B78  # CRC32C, reflected
_X0 = 1 << 31  # the polynomial 1 in reflected bit order


Buffer = bytes | bytearray | memoryview | np.ndarray


def crc32c(data: Buffer) -> int:
    """CRC32C of a contiguous buffer; ValueError for a non-contiguous array."""
    return extend(0, data)


def extend(crc: int, data: Buffer) -> int:
    """crc32c of (the bytes crc covers) + data, from crc and data alone."""
    if isinstance(data, np.ndarray) and not data.flags.c_contiguous:
        raise ValueError("crc32c needs a C-contiguous array")
    return _crc32c.crc32c(data, crc)


def combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """crc32c of the concatenation a + b, from crc32c(a), crc32c(b), len(b)."""
    if len_b <= 0:
        return crc_a
    t0, t1, t2, t3 = _shift_tables(len_b)
    return t0[crc_a & 0xFF] ^ t1[(crc_a >> 8) & 0xFF] ^ t2[(crc_a >> 16) & 0xFF] ^ t3[crc_a >> 24] ^ crc_b


def fold(crc: int, parts: Iterable[int], length: int) -> int:
    """combine(crc, p, length) for each p of parts in turn: crc32c of a
    range followed by equal-length ranges with crc32c parts (the loop of
    combine without its call and table lookup per part: about a third of
    its cost in Python)."""
    if length <= 0:
        return crc
    t0, t1, t2, t3 = _shift_tables(length)
    for part in parts:
        crc = t0[crc & 0xFF] ^ t1[(crc >> 8) & 0xFF] ^ t2[(crc >> 16) & 0xFF] ^ t3[crc >> 24] ^ part
    return crc


def _multmodp(a: int, b: int) -> int:
    """a * b modulo POLY, both in reflected bit order (zlib's multmodp)."""
    m, p = _X0, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1


@lru_cache(maxsize=None)
def _x2n(k: int) -> int:
    """x^(2^k) modulo POLY."""
    return 1 << 30 if k == 0 else _multmodp(_x2n(k - 1), _x2n(k - 1))


def _x8nmodp(n: int) -> int:
    """x^(8 n) modulo POLY: the factor that shifts a register past n bytes."""
    p, k = _X0, 3
    while n:
        if n & 1:
            p = _multmodp(_x2n(k), p)
        n >>= 1
        k += 1
    return p


@lru_cache(maxsize=256)
def _shift_tables(n: int) -> tuple[tuple[int, ...], ...]:
    """Four byte tables of the linear map crc -> crc * x^(8 n) mod POLY."""
    factor = _x8nmodp(n)
    columns = [_multmodp(factor, 1 << bit) for bit in range(32)]
    tables = []
    for byte in range(4):
        cols = columns[8 * byte:8 * byte + 8]
        table = [0] * 256
        for value in range(1, 256):
            low = value & -value
            table[value] = table[value ^ low] ^ cols[low.bit_length() - 1]
        tables.append(tuple(table))
    return tuple(tables)
