"""Identifier types shared by every service, defined here once.

They are NewTypes so a node id cannot be passed where an order id is meant;
at run time they are plain str/int.
"""
from __future__ import annotations

from typing import NewType

NodeId = NewType("NodeId", str)
OrderId = NewType("OrderId", str)
# A chained content hash of one full KV block (uint64, as in the protos).
BlockHash = NewType("BlockHash", int)
# A prefix family key: the unit that is forecast and replicated.
Family = NewType("Family", str)

UINT64_MAX = (1 << 64) - 1


def default_family(block_hashes: list[int] | tuple[int, ...]) -> Family:
    """The family of a chain when none is given: its first block hash in decimal."""
    return Family(str(block_hashes[0])) if block_hashes else Family("")
