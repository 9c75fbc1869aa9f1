"""NIXL's own transfer of the replication's bytes, without speckv: the
ceiling of the kvstore's `nixl` transport (ratio nixl_over_raw_nixl).

Two spawned processes, each with one agent and one registered buffer of
`nbytes` (reused and touched first): the target hands its metadata and
buffer address to the source over a pipe (where speckv uses gRPC), and the
source times NIXL WRITEs of the whole buffer as ONE descriptor (speckv's
writes one per (layer, K/V) and run of pages, so this is the stricter
ceiling), each from creating the transfer to its completion. GB/s = 1e9
B/s, the best of `repeats` after one untimed warm-up write (connection set-up
and first-touch faults). UCX chooses its transport in both, as in speckv.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import Connection

import numpy as np

from speckv.services.kvstore.nixl.loader import LOADER

AGENT_CONFIG = {"enable_prog_thread": True, "enable_listen_thread": False, "backends": ["UCX"]}


def available() -> bool:
    return LOADER.api() is not None


def raw_nixl_gbps(nbytes: int, repeats: int, timeout_s: float = 300.0) -> float:
    """Best GB/s of NIXL WRITEs of nbytes between two fresh processes."""
    ctx = mp.get_context("spawn")
    source_end, target_end = ctx.Pipe()
    target = ctx.Process(target=_target, args=(target_end, nbytes), daemon=True)
    target.start()
    try:
        if not source_end.poll(timeout_s):
            raise RuntimeError("raw NIXL target did not answer")
        metadata, address = source_end.recv()
        return _source(metadata, address, nbytes, repeats)
    finally:
        source_end.send("done")
        target.join(timeout=30)
        if target.is_alive():
            target.kill()


def _agent(name: str, buffer: np.ndarray):
    api = LOADER.api()
    assert api is not None, "NIXL is not installed"
    agent = api.nixl_agent(name, api.nixl_agent_config(**AGENT_CONFIG))
    agent.register_memory(np.array([[buffer.ctypes.data, buffer.nbytes, 0]], dtype=np.uint64), "DRAM")
    return agent


def _target(conn: Connection, nbytes: int) -> None:
    buffer = np.ones(nbytes, dtype=np.uint8)
    agent = _agent("raw-nixl-target", buffer)
    conn.send((agent.get_agent_metadata(), buffer.ctypes.data))
    conn.recv()  # the source is done writing


def _source(metadata: bytes, address: int, nbytes: int, repeats: int) -> float:
    buffer = np.full(nbytes, 7, dtype=np.uint8)
    agent = _agent("raw-nixl-source", buffer)
    remote = agent.add_remote_agent(metadata)
    local_rows = np.array([[buffer.ctypes.data, nbytes, 0]], dtype=np.uint64)
    remote_rows = np.array([[address, nbytes, 0]], dtype=np.uint64)

    def write() -> float:
        started = time.perf_counter()
        handle = agent.initialize_xfer("WRITE", agent.get_xfer_descs(local_rows, "DRAM"),
                                       agent.get_xfer_descs(remote_rows, "DRAM"), remote)
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        seconds = time.perf_counter() - started
        handle.release()
        if state != "DONE":
            raise RuntimeError(f"raw NIXL write failed: {state}")
        return seconds

    write()  # warm-up
    return nbytes / min(write() for _ in range(repeats)) / 1e9
