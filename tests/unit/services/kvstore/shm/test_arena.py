"""Shared arenas: another process maps the owner's memory through /proc and
sees its bytes; stale or foreign addresses are refused."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.kvstore.shm.arena import HostIdentity, MappedArena, SharedArena


def test_another_process_reads_and_writes_the_arena():
    arena = SharedArena(4096, "test")
    mine = arena.array()
    mine[:4] = [1, 2, 3, 4]
    a = arena.address
    code = ("from speckv.services.kvstore.shm.arena import ArenaAddress, HostIdentity, MappedArena\n"
            f"host = HostIdentity({a.host.boot_id!r}, {a.host.pid_namespace})\n"
            f"peer = MappedArena(ArenaAddress({a.pid}, {a.fd}, {a.size}, {a.token!r}, host)).array()\n"
            "print(peer[:4].tolist()); peer[4] = 99\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[1, 2, 3, 4]"
    assert mine[4] == 99
    arena.close()


def test_arena_starts_zeroed_and_sized():
    arena = SharedArena(10_000, "zero")
    assert arena.array().size == 10_000 and not arena.array().any()
    with pytest.raises(InvalidArgument):
        SharedArena(0, "empty")


def test_wrong_token_or_size_is_refused():
    arena = SharedArena(4096, "t")
    with pytest.raises(FailedPrecondition, match="not the arena"):
        MappedArena(replace(arena.address, token="0123456789abcdef"))
    with pytest.raises(FailedPrecondition, match="bytes, told"):
        MappedArena(replace(arena.address, size=8192))
    mapped = MappedArena(arena.address)  # the right address maps
    mapped.array()[0] = 5
    assert arena.array()[0] == 5


def test_another_host_or_a_closed_fd_is_refused():
    arena = SharedArena(4096, "t")
    other = HostIdentity("another-boot-id", arena.address.host.pid_namespace)
    with pytest.raises(FailedPrecondition, match="another host"):
        MappedArena(replace(arena.address, host=other))
    address = arena.address
    arena.close()
    with pytest.raises(FailedPrecondition):
        MappedArena(address)


def test_no_proc_is_never_the_same_host():
    assert not HostIdentity("", 0).shares_memory_with(HostIdentity("", 0))
    here = HostIdentity.here()
    assert here.shares_memory_with(HostIdentity.here())


def test_array_views_survive_close():
    arena = SharedArena(64, "t")
    view = arena.array()
    arena.close()
    view[:] = 7  # the mapping lives on with its views
    assert np.all(view == 7)
