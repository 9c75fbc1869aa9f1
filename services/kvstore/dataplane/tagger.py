"""The TCP sender's chunk tags computed beside the send (issue 42): with
data_plane_auth on, each chunk's AES-GMAC tag (possession.ChunkMac) is
computed on a tagging thread while the connection's thread sendmsg's the
same chunk's header and payload; the tag, which the wire puts after the
payload, goes out in the next sendmsg, ahead of the next frame (or the END
frame). Both the GMAC (cryptography's) and the kernel's copy release the
GIL, so on two cores they overlap instead of running one after the other.

Why the chunk's own send and not read-ahead of the next chunk: a packed
chunk's bytes are a staging buffer that is valid only until the next chunk
is asked for (pack_pipeline.py), so the next chunk cannot be tagged while
this one is still being sent; tagging the chunk being sent needs nothing
but that its bytes stay put until its send returns, which holds for packed
and zero-copy (pinned pages) chunks alike.

Threshold: a chunk under AHEAD_MIN_BYTES (128 KiB) is tagged inline: its
GMAC takes a few microseconds, less than handing it to a thread and back.
One chunk at a time: start() then tag() before the next start(). Not
thread-safe beyond that handover; one Tagger per connection.
"""
from __future__ import annotations

import queue
import threading
from typing import Sequence

from speckv.services.kvstore.dataplane.possession import ChunkMac

AHEAD_MIN_BYTES = 128 * 1024

_Job = tuple[ChunkMac, Sequence[memoryview]]


class Tagger:
    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._tags: queue.SimpleQueue[bytes | BaseException] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pending = False

    def start(self, mac: ChunkMac, pieces: Sequence[memoryview]) -> None:
        """Starts tagging pieces (the chunk's payload, in order) on the
        tagging thread; their bytes must not change until tag() returns."""
        if self._pending:
            raise RuntimeError("a chunk's tag is still pending: call tag() first")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((mac, pieces))
        self._pending = True

    def tag(self) -> bytes:
        """The started chunk's tag (waits for it); its error, if any, raised."""
        if not self._pending:
            raise RuntimeError("no chunk is being tagged")
        self._pending = False
        result = self._tags.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        """Waits out a pending tag (its bytes stay put until then) and stops the thread."""
        if self._pending:
            self._pending = False
            self._tags.get()
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            mac, pieces = job
            try:
                for piece in pieces:
                    mac.update(piece)
                self._tags.put(mac.tag())
            except BaseException as exc:  # noqa: BLE001 - handed to the connection's thread
                self._tags.put(exc)
