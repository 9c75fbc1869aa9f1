"""Each NIXL batch checked as it lands (nixl/landing.py), with two real NIXL
agents in one process and two real stores: the source's pages go by NIXL
WRITE, each batch with its note, into a target reservation whose landing
thread checks them; commit then reads nothing again. Sizes 0, 1, n-1, n,
n+1 blocks of an n-block batch land byte for byte; a batch corrupted on its
way aborts the reservation (pages freed, nothing visible); a repeated or
out-of-range note aborts it; a lost note is read at commit; notes naming no
expected reservation are dropped. Skipped where NIXL is not installed."""
from __future__ import annotations

import itertools

import pytest

from speckv.services.common.errors import Aborted
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.nixl.agent import NixlAgent
from speckv.services.kvstore.nixl.batch_note import BatchNote, batch_crcs, notes_for
from speckv.services.kvstore.nixl.landing import NixlLanding
from speckv.services.kvstore.nixl.layout import write_batches
from speckv.services.kvstore.nixl.loader import NixlLoader
from tests.support.kvstore_service import TINY, make_store, read, writes

API = NixlLoader().api()
pytestmark = pytest.mark.skipif(API is None, reason="NIXL is not installed")
PER_BATCH = 3
FAR_FUTURE = float("inf")
BLOCK = TINY.bytes_per_block
ORDERS = itertools.count()


class Pair:
    """A source store and agent, a target store, agent and landing thread."""

    def __init__(self) -> None:
        self.source = make_store(64, "s")
        self.target = make_store(64, "t")
        self.source_agent = NixlAgent(API, "s", {"GPU": self.source.host_pools()[Tier.DEVICE]}, TINY)
        self.target_agent = NixlAgent(API, "t", {"GPU": self.target.host_pools()[Tier.DEVICE]}, TINY)
        self.remote = self.source_agent.load_remote(self.target_agent.metadata())
        self.landing = NixlLanding(self.target_agent.notifications, self.target, quiet_s=QUIET_S).start()

    def close(self) -> None:
        self.landing.stop()
        self.source_agent.close()
        self.target_agent.close()

    def send(self, hashes: list[int], notes: str = "all", corrupt: bool = False) -> tuple[str, dict[int, int]]:
        """Reserves hashes on the target and writes them from the source in
        batches of PER_BATCH blocks. notes: all, drop-last (its note never
        sent), repeat-first (sent twice, the second as one more batch), or
        out-of-range. corrupt: the second batch's bytes change after their
        checksums were taken (as if damaged on the way). Returns the handle
        and the chunk checksums a commit carries."""
        self.source.put_blocks(writes(*hashes))
        grant = self.target.reserve(f"o{next(ORDERS)}", hashes, 30.0)
        self.landing.expect(grant.handle, 30.0)
        if not grant.hashes:
            return grant.handle, {}
        tier, source_pages = self.source.pages_of(grant.hashes)
        pool, segment_crcs = self.source.copy_source(tier, source_pages)
        _, target_pages = self.target.reservation_pages(grant.handle, shared=False)
        batches = write_batches(self.source_agent.region_of(pool), self.target_agent.regions["GPU"], source_pages,
                                target_pages, PER_BATCH)
        crcs = batch_crcs(batches, segment_crcs, BLOCK, TINY.segment_bytes)
        sent = notes_for(grant.handle, batches, crcs, BLOCK)
        if corrupt:
            pool[0, 0, source_pages[PER_BATCH]].view("uint8")[0] ^= 0xFF
        if notes == "drop-last":
            sent[-1] = b""
        elif notes == "repeat-first":
            batches, sent = [*batches, batches[0]], [*sent, sent[0]]
        elif notes == "out-of-range":
            sent[-1] = BatchNote(grant.handle, len(hashes) * BLOCK, BLOCK, 0).encode()
        self.source_agent.write(self.remote, batches, FAR_FUTURE, notes=sent)
        return grant.handle, crcs

    def commit(self, handle: str, crcs: dict[int, int]) -> int:
        self.landing.settle(handle, crcs.keys())
        return self.target.commit_shared(handle, crcs, 0.0, landed=True)


# Generous: under a full suite the landing thread may wait seconds for a core, and a commit that stops
# waiting before a bad note is read would take the lost-note path and not abort.
QUIET_S = 5.0


@pytest.fixture(scope="module")
def pair():
    made = Pair()
    yield made
    made.close()


@pytest.mark.parametrize("count", [0, 1, PER_BATCH - 1, PER_BATCH, PER_BATCH + 1, 4 * PER_BATCH])
def test_every_batch_is_checked_as_it_lands_and_the_copy_is_exact(pair, count):
    """count 0: the target holds the order's block already; nothing is sent."""
    hashes = list(range(1000 * (count + 1), 1000 * (count + 1) + max(count, 1)))
    if not count:
        pair.target.put_blocks(writes(*hashes))
    before = pair.landing.checked
    handle, crcs = pair.send(hashes)
    assert pair.commit(handle, crcs) == count
    assert pair.landing.checked - before == -(-count // PER_BATCH)  # every batch checked on landing
    assert read(pair.target, *hashes) == [w.data for w in writes(*hashes)]
    assert pair.target.stats().reserved_pages == 0 and pair.landing.expected == 0


def test_a_batch_corrupted_on_its_way_aborts_the_reservation_and_frees_its_pages(pair):
    hashes = list(range(50_000, 50_000 + 2 * PER_BATCH))
    handle, crcs = pair.send(hashes, corrupt=True)
    with pytest.raises(Aborted, match="crc32c"):
        pair.commit(handle, crcs)
    assert pair.target.stats().reserved_pages == 0
    assert pair.target.lookup(hashes).prefix_blocks == 0


@pytest.mark.parametrize("notes", ["repeat-first", "out-of-range"])
def test_a_note_repeating_checked_bytes_or_outside_the_reservation_aborts_it(pair, notes):
    hashes = list(range(60_000 + 100 * len(notes), 60_000 + 100 * len(notes) + 2 * PER_BATCH))
    handle, crcs = pair.send(hashes, notes=notes)
    with pytest.raises(Aborted):
        pair.commit(handle, crcs)
    assert pair.target.stats().reserved_pages == 0
    assert pair.target.lookup(hashes).prefix_blocks == 0


def test_a_batch_whose_note_never_came_is_read_at_commit(pair):
    hashes = list(range(70_000, 70_000 + 2 * PER_BATCH + 1))
    before = pair.landing.checked
    handle, crcs = pair.send(hashes, notes="drop-last")
    assert pair.commit(handle, crcs) == len(hashes)
    assert pair.landing.checked - before == 2
    assert read(pair.target, *hashes) == [w.data for w in writes(*hashes)]


def test_notes_naming_no_expected_reservation_are_dropped(pair):
    """A reservation not reserved for NIXL (never expected) is not touched
    by a note naming it, even over bytes a peer wrote into its pages with
    the right checksum: its own writer's chunk and commit go on as usual.
    A NIXL order sent after the stray notes makes the thread read them."""
    plain_hashes = [80_001]
    grant = pair.target.reserve("plain", plain_hashes, 30.0)
    data = writes(*plain_hashes)[0].data
    pair.source.put_blocks(writes(*plain_hashes))
    tier, source_pages = pair.source.pages_of(plain_hashes)
    pool, _ = pair.source.copy_source(tier, source_pages)
    _, target_pages = pair.target.reservation_pages(grant.handle, shared=False)
    stray = write_batches(pair.source_agent.region_of(pool), pair.target_agent.regions["GPU"], source_pages,
                          target_pages)
    pair.source_agent.write(pair.remote, [*stray, *stray], FAR_FUTURE,
                            notes=[BatchNote(grant.handle, 0, BLOCK, crc32c(data)).encode(), b"not a note at all"])
    refused = pair.landing.refused
    handle, crcs = pair.send(list(range(81_000, 81_000 + PER_BATCH)))
    assert pair.commit(handle, crcs) == PER_BATCH
    assert pair.target.write_chunk(grant.handle, 0, data, crc32c(data)) == BLOCK  # not taken as written
    assert pair.target.commit(grant.handle, {0: crc32c(data)}, 0.0) == 1
    assert pair.landing.refused == refused and read(pair.target, *plain_hashes) == [data]
