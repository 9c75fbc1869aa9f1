"""What the KV of a prompt costs by each path: recompute it, promote it from
the node's host tier, load it from the node's disk tier, or pull it from a
peer. Pure: numbers in, numbers out.

For a prompt of P tokens whose KV for the first P - 1 tokens exists (the
engine always computes the last token itself, as the router caps cached
tokens at P - 1), in ms:

    recompute(P) = prefill_ms(P, cached=0)
    promote(P)   = host_link.transfer_ms((P - 1) * B) + prefill_ms(1, cached=P - 1)
    load(P)      = disk_path.transfer_ms((P - 1) * B) + prefill_ms(1, cached=P - 1)
    pull(P)      = link.transfer_ms((P - 1) * B)      + prefill_ms(1, cached=P - 1)

with B the model's KV bytes per token and disk_path the disk's read and then
the host link's copy, one after the other (disks.serial: a disk load lands in
the host tier, then crosses to the device as a host hit does). Each is a quadratic in P; with the
engine profile's overhead o, ms_per_token a and ms_per_token_pair c, and a
link's per-transfer overhead L and ms per token k = 8 B / (Gbit/s * 1e9) * 1e3:

    recompute(P) = c/2 P^2 + (a + c/2) P + o
    transfer(P)  =           (k + c) P   + (L - k + o + a)

so recompute beats a transfer on one interval of prompt lengths (its excess
over the transfer is convex and -L at P = 1), and two transfers split the
prompt lengths at one point. Ranges are of whole tokens, P >= 1; an upper end
of None means the range never ends.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from speckv.services.common.disks import serial
from speckv.services.common.engine_profile import EngineProfile, LinkModel
from speckv.services.common.errors import InvalidArgument

PATHS = ("recompute", "promote", "load", "pull")
Quadratic = tuple[float, float, float]  # (q2, q1, q0): q2 P^2 + q1 P + q0, ms
TokenRange = tuple[int, int | None]  # [low, high] inclusive; high None: unbounded


@dataclass(frozen=True, slots=True)
class Segment:
    """Prompt lengths [low, high] (tokens, inclusive) where `path` is cheapest."""

    path: str
    low: int
    high: int


@dataclass(frozen=True, slots=True)
class CostTable:
    """The paths' costs for one engine profile and its links (each already
    the whole engine's: per-GPU bandwidth times its GPUs).
    host_link None: the node has no host tier, so no promote path;
    disk None: no disk tier, so no load path. A disk tier needs a host
    tier (its loads land there)."""

    profile: EngineProfile
    link: LinkModel
    host_link: LinkModel | None = None
    disk: LinkModel | None = None

    def __post_init__(self) -> None:
        if self.disk is not None and self.host_link is None:
            raise InvalidArgument("a disk tier needs a host tier: its loads land in host memory")

    @property
    def bytes_per_token(self) -> int:
        return self.profile.geometry.bytes_per_token

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for path in PATHS if (path != "promote" or self.host_link is not None)
                     and (path != "load" or self.disk is not None))

    def link_of(self, path: str) -> LinkModel:
        if path == "pull":
            return self.link
        if path == "promote" and self.host_link is not None:
            return self.host_link
        if path == "load" and self.disk is not None and self.host_link is not None:
            return serial(self.disk, self.host_link)
        raise InvalidArgument(f"path {path!r} moves no bytes or is not available here")

    def ms_per_token(self, path: str) -> float:
        """The path's price per token, ms: the profile's linear prefill term
        for recompute (its pair term comes on top), the wire time otherwise."""
        if path == "recompute":
            return self.profile.ms_per_token
        return self.bytes_per_token * 8.0 / (self.link_of(path).gbps * 1e9) * 1e3

    def fixed_ms(self, path: str) -> float:
        """The path's cost that does not grow with the prompt, ms."""
        if path == "recompute":
            return self.profile.overhead_ms
        return self.link_of(path).overhead_ms

    def quadratic(self, path: str) -> Quadratic:
        """Coefficients of cost(P) = q2 P^2 + q1 P + q0, ms (module docstring)."""
        o, a, c = self.profile.overhead_ms, self.profile.ms_per_token, self.profile.ms_per_token_pair
        if path == "recompute":
            return (c / 2, a + c / 2, o)
        k, link_ms = self.ms_per_token(path), self.fixed_ms(path)
        return (0.0, k + c, link_ms - k + o + a)

    def cost_ms(self, path: str, prompt_tokens: int) -> float:
        """The path's cost for a prompt of prompt_tokens >= 1, by the engine
        profile and link models themselves (not the quadratic)."""
        p = max(1, prompt_tokens)
        if path == "recompute":
            return self.profile.prefill_ms(p, 0)
        return self.link_of(path).transfer_ms((p - 1) * self.bytes_per_token) + self.profile.prefill_ms(1, p - 1)

    def beats(self, cheaper: str, dearer: str) -> TokenRange | None:
        """Prompt lengths where `cheaper` costs strictly less than `dearer`;
        None when there are none. Defined where the difference is convex:
        recompute against a transfer, or one transfer against another."""
        q = tuple(x - y for x, y in zip(self.quadratic(cheaper), self.quadratic(dearer)))
        if q[0] < 0:
            raise InvalidArgument(f"{cheaper} against {dearer} is not one interval; ask the other way round")
        return where_negative(q[0], q[1], q[2])

    def beats_recompute(self, path: str) -> TokenRange | None:
        """Prompt lengths where the transfer `path` costs strictly less than
        recomputing: the lengths past recompute's own interval (beats()),
        ties skipped; None when there are none."""
        found = self.beats("recompute", path)
        if found is not None and found[1] is None:
            return None
        p = 1 if found is None else found[1] + 1
        dearer = tuple(x - y for x, y in zip(self.quadratic(path), self.quadratic("recompute")))
        # Past recompute's interval recompute - path is >= 0 and convex, so
        # it is 0 (a tie) at two lengths at most, unless it is 0 everywhere.
        for _ in range(3):
            if np.polyval(dearer, p) < 0:
                return (p, None)
            p += 1
        return None

    def cheapest(self, max_tokens: int, paths: tuple[str, ...] = ()) -> list[Segment]:
        """For every prompt length 1..max_tokens, the cheapest of `paths`
        (default: every path available; ties go to the earlier of PATHS:
        recompute, promote, load, pull), as consecutive segments."""
        if max_tokens < 1:
            raise InvalidArgument("max_tokens must be >= 1")
        among = tuple(path for path in self.paths if path in paths) if paths else self.paths
        if not among:
            raise InvalidArgument(f"none of {paths} is available here ({', '.join(self.paths)})")
        p = np.arange(1, max_tokens + 1, dtype=np.float64)
        costs = np.array([np.polyval(self.quadratic(path), p) for path in among])
        best = np.argmin(costs, axis=0)
        starts = np.flatnonzero(np.r_[True, best[1:] != best[:-1]])
        ends = np.r_[starts[1:] - 1, len(best) - 1]
        return [Segment(among[best[s]], int(s) + 1, int(e) + 1) for s, e in zip(starts, ends)]


def where_negative(q2: float, q1: float, q0: float) -> TokenRange | None:
    """Integers P >= 1 with q2 P^2 + q1 P + q0 < 0, as one range; q2 >= 0
    (so the set is an interval). None when there are none."""
    if q2 < 0:
        raise InvalidArgument("where_negative needs q2 >= 0")

    def f(p: int) -> float:
        return (q2 * p + q1) * p + q0

    if q2 == 0 and q1 >= 0:
        # Non-decreasing: negative from P = 1 up to its root, if at all.
        if f(1) >= 0:
            return None
        if q1 == 0:
            return (1, None)
        return (1, _last_negative(f, 1, -q0 / q1))
    if q2 == 0:
        # Decreasing: negative from its root on, always somewhere.
        first = _first_negative(f, -q0 / q1, None)
        return None if first is None else (first, None)
    disc = q1 * q1 - 4 * q2 * q0
    if disc <= 0:
        return None
    root = math.sqrt(disc)
    low_root, high_root = (-q1 - root) / (2 * q2), (-q1 + root) / (2 * q2)
    if high_root < 1:
        return None
    low = _first_negative(f, low_root, high_root)
    if low is None:
        return None
    return (low, _last_negative(f, low, high_root))


def _first_negative(f: Callable[[int], float], root: float, limit: float | None) -> int | None:
    """The least P >= 1 past `root` where f < 0, the float rounding of the
    root checked against f itself; None when there is none up to `limit`."""
    p = max(1, math.floor(root) + 1)
    while p > 1 and f(p - 1) < 0:
        p -= 1
    while f(p) >= 0:
        p += 1
        if limit is not None and p > limit + 1:
            return None
    return p


def _last_negative(f: Callable[[int], float], low: int, root: float) -> int:
    """The greatest P >= low before `root` where f < 0, given f(low) < 0."""
    p = max(low - 1, math.ceil(root) - 1)
    while p >= low and f(p) >= 0:
        p -= 1
    while f(p + 1) < 0:
        p += 1
    return p
