"""Shared-memory arenas: a kvstore's pool memory that another process on the
same host maps, so bytes move between them with one memcpy and no socket.

SharedArena (the owner, the kvstore) creates an anonymous memfd, sizes it and
maps it; nothing is named in /dev/shm, so a kvstore killed with -9 leaves no
file behind: the memory is freed once its last mapping goes. MappedArena (a
peer: the engine connector, or another kvstore replicating in) opens it
through /proc/<owner pid>/fd/<fd>.

Who may map it: the kernel lets a process open another's /proc/<pid>/fd
links only if it may ptrace-read it (same user, or CAP_SYS_PTRACE), so the
boundary is the operating-system user, the same one that already guards the
kvstore's memory against a debugger. No capability of ours could narrow it:
a process of that user can read the pool out of the kvstore anyway. The gRPC
control calls (Reserve, MapBlocks, Commit) decide which pages a peer touches
and when they may be reused; see store_shared.py.

An arena is named `speckv-<label>-<token>`: the peer checks that the link it
opened names the token it was told, so a stale (pid, fd) pair after a restart
never maps someone else's memory. Two processes share memory only if they
run on one kernel and see one pid namespace: HostIdentity says which.
"""
from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speckv.services.common.errors import FailedPrecondition, InvalidArgument

PREFIX = "speckv-"


@dataclass(frozen=True, slots=True)
class HostIdentity:
    """Which kernel and pid namespace a process runs in."""

    boot_id: str  # /proc/sys/kernel/random/boot_id: one per booted kernel
    pid_namespace: int  # inode of /proc/self/ns/pid

    @classmethod
    def here(cls) -> "HostIdentity":
        try:
            boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            namespace = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            return cls("", 0)  # no /proc: never the same host as anyone
        return cls(boot_id, namespace)

    def shares_memory_with(self, other: "HostIdentity") -> bool:
        return bool(self.boot_id) and self == other


@dataclass(frozen=True, slots=True)
class ArenaAddress:
    """What a peer needs to map an arena (sent over the control channel)."""

    pid: int
    fd: int
    size: int  # bytes
    token: str
    host: HostIdentity


class SharedArena:
    """size bytes of zeroed shared memory owned by this process."""

    def __init__(self, size: int, label: str) -> None:
        if size <= 0:
            raise InvalidArgument(f"shared arena of {size} bytes: must be > 0")
        self.token = secrets.token_hex(8)
        self._fd = os.memfd_create(f"{PREFIX}{label}-{self.token}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, size)
            self._map = mmap.mmap(self._fd, size)
        except OSError:
            os.close(self._fd)
            raise
        self.size = size
        self.address = ArenaAddress(os.getpid(), self._fd, size, self.token, HostIdentity.here())

    def array(self) -> np.ndarray:
        """The whole arena as a writable flat uint8 array (no copy)."""
        return np.frombuffer(self._map, dtype=np.uint8)

    def close(self) -> None:
        """Drops this process's fd; the mapping lives on while arrays view it
        and peers keep theirs, and the memory goes with the last of them."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class MappedArena:
    """A peer's SharedArena mapped into this process."""

    def __init__(self, address: ArenaAddress, medium: str = "") -> None:
        """medium: what the owner keeps there (its tier), for the peer's bookkeeping."""
        self.medium = medium
        if not HostIdentity.here().shares_memory_with(address.host):
            raise FailedPrecondition("shared memory: the arena's owner runs on another host or pid namespace")
        link = f"/proc/{address.pid}/fd/{address.fd}"
        try:
            fd = os.open(link, os.O_RDWR | os.O_CLOEXEC)
        except OSError as error:
            raise FailedPrecondition(f"shared memory: cannot open {link}: {error.strerror} (another user?)") from None
        try:
            self._check(fd, link, address)
            # No MAP_POPULATE: it would fault in (and allocate) the whole pool at map time, seconds for a
            # pool of GBs on every peer that maps it; a first copy pays a fault per 4 KiB page instead
            # (docs/journal/dataplane.md).
            self._map = mmap.mmap(fd, address.size)
        finally:
            os.close(fd)  # the mapping keeps the memory
        self.address = address

    @staticmethod
    def _check(fd: int, link: str, address: ArenaAddress) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if f"-{address.token}" not in target or PREFIX not in target:
            raise FailedPrecondition(f"shared memory: {link} is {target!r}, not the arena {address.token}")
        size = os.fstat(fd).st_size
        if size != address.size:
            raise FailedPrecondition(f"shared memory: arena {address.token} is {size} bytes, told {address.size}")

    def array(self) -> np.ndarray:
        return np.frombuffer(self._map, dtype=np.uint8)

    def close(self) -> None:
        """Unmaps (ValueError-free only when no array still views it: callers
        drop their views first; a leftover view keeps the mapping alive)."""
        try:
            self._map.close()
        except BufferError:
            pass  # arrays still view it; the mapping goes with them
