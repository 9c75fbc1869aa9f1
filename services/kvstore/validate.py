"""Checks on client input to the store. Each raises InvalidArgument with a
message naming what was wrong; none changes any state."""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import BlockHash

MAX_HASH = (1 << 64) - 1
SHOWN = 8  # hashes quoted in a message at most


def quote(hashes: Sequence[int]) -> str:
    """Up to SHOWN hashes for an error message, with a count of the rest."""
    shown = ", ".join(str(h) for h in hashes[:SHOWN])
    more = len(hashes) - SHOWN
    return shown + (f" (and {more} more)" if more > 0 else "")


def hash_list(hashes: Sequence[int], what: str, limit: int, *, unique: bool = False) -> list[BlockHash]:
    """A non-empty list of uint64 hashes, at most limit long (and without
    repeats if unique)."""
    if not hashes:
        raise InvalidArgument(f"{what}: no block hashes given")
    if len(hashes) > limit:
        raise InvalidArgument(f"{what}: {len(hashes)} block hashes, at most {limit} per request")
    bad = [h for h in hashes if not 0 <= h <= MAX_HASH]
    if bad:
        raise InvalidArgument(f"{what}: not uint64 block hashes: {quote(bad)}")
    if unique:
        repeated = [h for h, n in Counter(hashes).items() if n > 1]
        if repeated:
            raise InvalidArgument(f"{what}: repeated block hashes: {quote(repeated)}")
    return [BlockHash(h) for h in hashes]


def identifier(value: str, what: str) -> str:
    if not value or not value.strip():
        raise InvalidArgument(f"{what} is empty")
    if len(value) > 256:
        raise InvalidArgument(f"{what} is {len(value)} characters long, at most 256")
    return value


def lease(seconds: float, what: str, max_s: float = 24 * 3600.0) -> float:
    if not 0 < seconds <= max_s:
        raise InvalidArgument(f"{what}={seconds}: must be in (0, {max_s:g}] seconds")
    return seconds


def family(name: str, what: str, max_chars: int) -> str:
    """A family name ("" allowed: none) of at most max_chars characters: the
    store keeps it with every block and the scheduler with every family."""
    if len(name) > max_chars:
        raise InvalidArgument(f"{what} is {len(name)} characters long, at most {max_chars} (max_family_chars)")
    return name


def block_size(size: int, expected: int, index: int, block_hash: int) -> None:
    """Block `index` of a put (hash block_hash) is exactly `expected` bytes."""
    if size != expected:
        raise InvalidArgument(f"put_blocks: block {index} (hash {block_hash}) has {size} bytes, "
                              f"expected bytes_per_block={expected}")
