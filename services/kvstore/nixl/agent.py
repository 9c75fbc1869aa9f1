"""The kvstore's one NIXL agent (an adapter over NIXL's Python API).

Created at the kvstore's start when NIXL imports (loader.py) and --nixl is
on: it registers every host-memory pool (PagePool.data; for a shared-memory
pool that is the memfd mapping) with NIXL's UCX backend, which chooses the
transport (shared memory, TCP, RDMA where the fabric has it). Agent
metadata is exchanged over speckv's gRPC (KVStore.NixlMetadata), never
NIXL's own listener or etcd: the agent runs no listen thread.

A source writes with `write`: each Batch (layout.py) is one NIXL WRITE from
its registered pages to the remote's, a few in flight at once, polled to
completion under a deadline; each may carry a note NIXL delivers to the
remote once its bytes have landed (batch_note.py), which the target reads
with `notifications` (landing.py checks each batch as it lands). The agent name carries a random token, so a restarted kvstore is a
different remote agent and a peer holding the old metadata is told apart by
the name its Reserve answers.

Thread safety: NIXL's STRICT sync mode serializes calls into the agent;
replications of several orders share it.
"""
from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from types import ModuleType
from typing import Callable, Mapping, Sequence

import numpy as np

from speckv.services.common.errors import FailedPrecondition, Unavailable
from speckv.services.common.geometry import KVGeometry
from speckv.services.kvstore.nixl.layout import Batch, PoolRegion

log = logging.getLogger(__name__)
MEMORY = "DRAM"
POLL_S = 50e-6  # between completion checks of a transfer in progress: well under a MiB's time on any link
WINDOW = 4  # transfers in flight per order: the next batch is posted while earlier ones complete


class NixlAgent:
    """One agent, its registered pools by medium."""

    def __init__(self, api: ModuleType, node_id: str, pools: Mapping[str, np.ndarray], geometry: KVGeometry) -> None:
        """pools: medium -> the pool array (contiguous host memory)."""
        self.name = f"speckv-{node_id}-{secrets.token_hex(6)}"
        self.geometry = geometry
        sync = getattr(api, "nixl_thread_sync_t", None)
        config = api.nixl_agent_config(enable_prog_thread=True, enable_listen_thread=False, backends=["UCX"],
                                       **({"sync_mode": sync.NIXL_THREAD_SYNC_STRICT} if sync else {}))
        self._agent = api.nixl_agent(self.name, config)
        if "UCX" not in getattr(self._agent, "backends", {"UCX": None}):
            raise FailedPrecondition("NIXL: the UCX backend did not start (its plugin is missing)")
        self.regions: dict[str, PoolRegion] = {}
        self._registered = []
        for medium, array in pools.items():
            if not array.flags.c_contiguous:
                raise FailedPrecondition(f"NIXL: the {medium} pool is not contiguous")
            self._registered.append(self._agent.register_memory(_rows([(array.ctypes.data, array.nbytes)]), MEMORY))
            self.regions[medium] = PoolRegion(array.ctypes.data, array.shape[2], geometry.num_layers,
                                              geometry.segment_bytes)

    def metadata(self) -> bytes:
        """Everything a peer needs to reach this agent and write its
        registered memory (connection info and remote keys)."""
        return bytes(self._agent.get_agent_metadata())

    def region_of(self, array: np.ndarray) -> PoolRegion:
        """The registered pool that array is; FailedPrecondition if none."""
        for region in self.regions.values():
            if region.address == array.ctypes.data and region.size == array.nbytes:
                return region
        raise FailedPrecondition("NIXL: this pool is not registered with the kvstore's agent")

    def load_remote(self, metadata: bytes) -> str:
        """Loads a peer's metadata; returns its agent name."""
        try:
            name = self._agent.add_remote_agent(metadata)
        except Exception as exc:  # noqa: BLE001 - NIXL raises its own exception types
            raise Unavailable(f"NIXL: cannot load the peer's metadata: {exc}") from None
        return name.decode() if isinstance(name, bytes) else str(name)

    def forget_remote(self, name: str) -> None:
        """Drops a peer (a restarted or dead kvstore); best effort."""
        try:
            self._agent.remove_remote_agent(name)
        except Exception:  # noqa: BLE001 - it may never have connected
            log.debug("NIXL: removing remote agent %s failed", name, exc_info=True)

    def write(self, remote: str, batches: Sequence[Batch], deadline_s: float,
              pace: Callable[[int], None] = lambda nbytes: None, notes: Sequence[bytes] = (),
              window: int = WINDOW) -> int:
        """NIXL WRITEs of every batch to agent remote, in order, each paced
        before it is posted, at most window in flight; notes[i] (if given) is
        the notification NIXL delivers to remote once batch i has landed.
        Returns the bytes written. Unavailable when a transfer fails or the
        deadline (time.monotonic) passes; every transfer not yet completed is
        released (NIXL cancels it) before raising."""
        if notes and len(notes) != len(batches):
            raise ValueError(f"{len(notes)} notes for {len(batches)} batches")
        flying: deque[tuple[object, int]] = deque()  # (handle, bytes), oldest first
        written = 0
        try:
            for i, batch in enumerate(batches):
                while len(flying) >= max(1, window):
                    written += self._complete(flying, remote, deadline_s)
                pace(batch.nbytes)
                flying.append((self._post(remote, batch, notes[i] if notes else b""), batch.nbytes))
            while flying:
                written += self._complete(flying, remote, deadline_s)
        finally:
            for handle, _ in flying:
                _release(handle)
        return written

    def _post(self, remote: str, batch: Batch, note: bytes) -> object:
        local = self._agent.get_xfer_descs(batch.local, MEMORY)
        target = self._agent.get_xfer_descs(batch.remote, MEMORY)
        try:
            handle = self._agent.initialize_xfer("WRITE", local, target, remote, note)
        except Exception as exc:  # noqa: BLE001
            raise Unavailable(f"NIXL: cannot start a write to {remote}: {exc}") from None
        try:
            state = self._agent.transfer(handle)
        except Exception as exc:  # noqa: BLE001 - NIXL's errors (nixlRemoteDisconnectError: the peer died)
            _release(handle)
            raise Unavailable(f"NIXL: write to {remote} failed: {type(exc).__name__}: {exc}") from None
        if state not in ("PROC", "DONE"):
            _release(handle)
            raise Unavailable(f"NIXL: write to {remote} failed ({state})")
        return handle

    def _complete(self, flying: deque[tuple[object, int]], remote: str, deadline_s: float) -> int:
        """Waits for the oldest transfer in flying, removes and releases it;
        its bytes. On failure it stays in flying (the caller releases it)."""
        handle, nbytes = flying[0]
        try:
            state = self._agent.check_xfer_state(handle)
            while state == "PROC":
                if time.monotonic() > deadline_s:
                    raise Unavailable(f"NIXL: write to {remote} not done by its deadline")
                time.sleep(POLL_S)
                state = self._agent.check_xfer_state(handle)
        except Unavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - NIXL's errors (nixlRemoteDisconnectError: the peer died)
            raise Unavailable(f"NIXL: write to {remote} failed: {type(exc).__name__}: {exc}") from None
        if state != "DONE":
            raise Unavailable(f"NIXL: write to {remote} failed ({state})")
        flying.popleft()
        _release(handle)
        return nbytes

    def notifications(self) -> list[bytes]:
        """The notifications that arrived since the last call, from any
        remote agent (the sender's name is its own claim: not used)."""
        try:
            arrived = self._agent.get_new_notifs()
        except Exception:  # noqa: BLE001 - a closing agent: nothing arrived
            log.debug("NIXL: reading notifications failed", exc_info=True)
            return []
        return [message for messages in arrived.values() for message in messages]

    def close(self) -> None:
        for descs in self._registered:
            try:
                self._agent.deregister_memory(descs)
            except Exception:  # noqa: BLE001 - closing anyway
                log.debug("NIXL: deregistration failed", exc_info=True)
        self._registered.clear()


def _rows(ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    return np.array([[address, size, 0] for address, size in ranges], dtype=np.uint64)


def _release(handle: object) -> None:
    try:
        handle.release()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a handle of a failed transfer may refuse; the agent reaps it
        log.debug("NIXL: releasing a transfer handle failed", exc_info=True)
