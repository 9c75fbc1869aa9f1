"""The target's check of each NIXL transfer as it lands: one thread per
kvstore reads its agent's notifications (batch_note.py) and checksums the
bytes each names while the writer's next transfers are still landing, so a
Commit waits for the last batch's check rather than reading the whole
reservation back.

Algorithm. A Reserve with nixl registers its handle (expect) for the
reservation's lease, renewed by each batch checked. While any handle is
expected the thread polls the agent every POLL_S (idle otherwise: it waits
on a condition, so a kvstore with no NIXL reservation open spends nothing).
For a note naming an expected handle it opens a zero-copy write of the
note's range (store.begin_write: inside the reservation, not written
before, pages held until it ends), crc32c's the landed segments and ends it
(dataplane/checker.check_landed, the TCP checking thread's check: a
mismatch aborts the reservation and frees its pages). A note that is
malformed or names no expected handle is dropped; one whose range is
refused (outside, or written already: the bytes may have changed since an
earlier check) aborts the reservation.

Commit (settle) waits until every chunk the writer commits was checked, or
the reservation failed, or no check of it completed for QUIET_S (a lost
note, a writer that sent none); it then retires the handle (later notes for
it are dropped) and waits for a check of it in progress. The store's
commit_shared reads from the pages whatever was not checked here, so every
byte is checksummed by the target after it landed either way.

What a note cannot do: make anything visible (only Commit, with the write
capability, publishes, and only when every chunk's crc32c matches the one
the writer commits). Anyone who can write the registered pools (docs/
dataplane.md) can also send notes; a note naming another writer's handle
(48 random bits, sent only over gRPC) at most gets its bytes checked early
and the order failed, which writing garbage into the pages does anyway.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Protocol

from speckv.services.common.errors import Aborted, AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from speckv.services.kvstore.dataplane.checker import Landed, WriteEnds, check_landed
from speckv.services.kvstore.nixl.batch_note import BatchNote, parse
from speckv.services.kvstore.records import ZeroCopyWrite

log = logging.getLogger(__name__)
POLL_S = 200e-6  # between notification polls while a NIXL reservation is open: a 4 MiB batch lands in ~1-4 ms here
IDLE_S = 1.0  # the thread's wait when nothing is expected (it is woken by expect)
QUIET_S = 2.0  # a commit stops waiting for notes after this long without a check of its reservation


class LandingStore(WriteEnds, Protocol):
    """What the landing thread needs of the store (KVStoreCore satisfies it)."""

    def begin_write(self, handle: str, offset: int, size: int) -> ZeroCopyWrite | None: ...

    def abort(self, handle: str, reason: str = "") -> int: ...


@dataclass(slots=True)
class Expected:
    """A NIXL reservation whose batches are checked as they land."""

    lease_s: float
    until: float  # time.monotonic(); dropped after (the writer is gone; the store's lease frees the pages)
    checked: set[int] = field(default_factory=set)  # offsets of the batches that passed
    failed: bool = False
    checking: bool = False
    last_progress: float = 0.0


class NixlLanding:
    """The landing thread of one kvstore's agent. notifications: the agent's
    new notification messages (NixlAgent.notifications); clock: monotonic
    seconds."""

    def __init__(self, notifications: Callable[[], list[bytes]], store: LandingStore,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_S, quiet_s: float = QUIET_S) -> None:
        self._notifications = notifications
        self._store = store
        self._clock = clock
        self._poll_s = poll_s
        self._quiet_s = quiet_s
        self._cond = threading.Condition()
        self._expected: dict[str, Expected] = {}
        self._stopped = False
        self.checked = 0  # batches that passed, since start
        self.refused = 0  # batches refused (their reservation aborted)
        self._thread = threading.Thread(target=self._run, name="nixl-landing", daemon=True)

    def start(self) -> NixlLanding:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def expect(self, handle: str, lease_s: float) -> None:
        """Checks the notes naming handle from now on (a Reserve with nixl)."""
        with self._cond:
            now = self._clock()
            self._expected[handle] = Expected(lease_s, now + lease_s, last_progress=now)
            self._cond.notify_all()

    def forget(self, handle: str) -> None:
        """Drops handle (aborted); a check of it in progress ends on its own."""
        with self._cond:
            self._expected.pop(handle, None)

    def settle(self, handle: str, offsets: Collection[int]) -> None:
        """Waits until the batch at each offset was checked, the reservation
        failed, or no check of it completed for quiet_s; then retires handle
        and waits for a check of it in progress (the caller commits next)."""
        with self._cond:
            entry = self._expected.get(handle)
            if entry is None:
                return
            entry.last_progress = self._clock()
            wanted = set(offsets)
            while not entry.failed and not wanted <= entry.checked and not self._stopped:
                left = entry.last_progress + self._quiet_s - self._clock()
                if left <= 0:
                    log.info("NIXL: reservation %s: %d batch note(s) not in after %.1f s; the commit reads those "
                             "chunks itself", handle, len(wanted - entry.checked), self._quiet_s)
                    break
                self._cond.wait(left)
            if self._expected.get(handle) is entry:
                del self._expected[handle]
            while entry.checking:
                self._cond.wait()

    @property
    def expected(self) -> int:
        """NIXL reservations being watched (for tests and stats)."""
        with self._cond:
            return len(self._expected)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._prune()
                while not self._expected and not self._stopped:
                    self._cond.wait(IDLE_S)
                    self._prune()
                if self._stopped:
                    return
            messages = self._notifications()
            for message in messages:
                note = parse(message)
                if note is not None:
                    self._land(note)
            if not messages:
                time.sleep(self._poll_s)

    def _prune(self) -> None:
        now = self._clock()
        for handle in [h for h, e in self._expected.items() if e.until <= now and not e.checking]:
            del self._expected[handle]

    def _land(self, note: BatchNote) -> None:
        with self._cond:
            entry = self._expected.get(note.handle)
            if entry is None or entry.failed:
                return  # not one of our NIXL reservations (or retired): nothing to check
            entry.checking = True
        passed = False
        try:
            passed = self._check(note)
        finally:
            with self._cond:
                now = self._clock()
                entry.checking = False
                entry.last_progress, entry.until = now, now + entry.lease_s
                if passed:
                    entry.checked.add(note.offset)
                    self.checked += 1
                else:
                    entry.failed = True
                    self.refused += 1
                self._cond.notify_all()

    def _check(self, note: BatchNote) -> bool:
        """Whether the note's bytes passed; a failed reservation is aborted."""
        try:
            write = self._store.begin_write(note.handle, note.offset, note.size)
            if write is None:
                raise FailedPrecondition(f"reservation {note.handle} is not in host memory")
            check_landed(self._store, Landed(write, note.handle, note.offset, note.crc32c, None, b""))
            return True
        except (Aborted, NotFound) as exc:  # a crc mismatch (the book aborted it and freed the pages), or gone
            log.warning("NIXL: batch %d+%d of %s refused: %s", note.offset, note.size, note.handle, exc)
        except (AlreadyExists, InvalidArgument, FailedPrecondition) as exc:
            log.warning("NIXL: batch note %d+%d of %s refused (%s): reservation aborted", note.offset, note.size,
                        note.handle, exc)
            self._abort(note.handle, f"a NIXL batch note was refused: {exc}")
        except Exception:  # noqa: BLE001 - the thread outlives one bad batch; the reservation does not
            log.exception("NIXL: checking batch %d+%d of %s failed", note.offset, note.size, note.handle)
            self._abort(note.handle, "checking a NIXL batch failed")
        return False

    def _abort(self, handle: str, reason: str) -> None:
        try:
            self._store.abort(handle, reason)
        except (Aborted, NotFound, FailedPrecondition, InvalidArgument):
            pass  # already closed
