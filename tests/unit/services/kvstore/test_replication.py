from __future__ import annotations

import dataclasses

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import Aborted, FailedPrecondition, InvalidArgument, ResourceExhausted
from speckv.services.common.geometry import KVGeometry
from speckv.services.kvstore.events import EventType
from speckv.services.kvstore.local_target import LocalTarget
from speckv.services.kvstore.replication import Replicator, TransferOrder, TransferOutcome
from tests.support.kvstore_service import TINY, block_bytes, make_store, read, retained_events, writes

KIB = 1024
BIG = KVGeometry(5, 8, 128, "float16", 16, "big")  # 320 KiB blocks: larger than a 256 KiB chunk


def pair(geometry=TINY, source_pages=16, target_pages=16, chunk_bytes=256 * KIB):
    clock = ManualClock(50.0)
    source = make_store(source_pages, "a", geometry, clock)
    target = make_store(target_pages, "b", geometry, clock)
    targets = {"b:1": target}
    replicator = Replicator(source, lambda address: LocalTarget(targets[address]), clock, chunk_bytes=chunk_bytes)
    return source, target, replicator, clock


def order(*hashes, lease_s=0.0):
    return TransferOrder("o1", tuple(hashes), "b:1", family="f", source_node="a", target_node="b", replica_lease_s=lease_s)


@pytest.mark.parametrize("geometry, count, chunk_kib", [
    (TINY, 1, 256), (TINY, 600, 256), (BIG, 3, 256), (BIG, 4, 1024),
])
def test_replicated_blocks_are_byte_exact_on_the_target(geometry, count, chunk_kib):
    hashes = list(range(1, count + 1))
    source, target, replicator, _ = pair(geometry, count + 1, count + 1, chunk_kib * KIB)
    source.put_blocks(writes(*hashes, geometry=geometry))
    result = replicator.replicate(order(*hashes))
    assert result.outcome is TransferOutcome.COMMITTED, result.message
    assert (result.blocks_sent, result.blocks_skipped) == (count, 0)
    assert result.bytes_sent == count * geometry.bytes_per_block
    assert read(target, *hashes) == [block_bytes(h, geometry) for h in hashes]
    committed = [e for e in retained_events(target) if e.type is EventType.COMMITTED]
    assert [e.block_hashes for e in committed] == [tuple(hashes)] and committed[0].order_id == "o1"
    assert source.stats().pinned_pages == 0 and target.stats().reserved_pages == 0


def test_blocks_on_the_target_are_skipped_and_replicas_carry_the_lease():
    source, target, replicator, _ = pair()
    source.put_blocks(writes(1, 2, 3))
    target.put_blocks(writes(1))
    result = replicator.replicate(order(1, 2, 3, lease_s=30.0))
    assert (result.blocks_sent, result.blocks_skipped) == (2, 1)
    assert target.stats().replica_pages == 2


def test_source_lacking_blocks_is_a_failed_precondition_naming_them():
    source, target, replicator, _ = pair()
    source.put_blocks(writes(1))
    with pytest.raises(FailedPrecondition, match="lacks 2 of 3 blocks: 7, 8"):
        replicator.replicate(order(1, 7, 8))
    assert target.stats().reserved_pages == 0


def test_full_target_fails_the_order_and_releases_everything():
    source, target, replicator, _ = pair(target_pages=2)
    source.put_blocks(writes(1, 2, 3))
    target.put_blocks(writes(8, 9))
    target.pin([8, 9])
    result = replicator.replicate(order(1, 2, 3))
    assert result.outcome is TransferOutcome.FAILED and isinstance(result.error, ResourceExhausted)
    assert source.stats().pinned_pages == 0 and target.stats().reserved_pages == 0


def test_geometry_mismatch_aborts_the_reservation():
    clock = ManualClock(0.0)
    source = make_store(4, "a", TINY, clock)
    target = make_store(4, "b", dataclasses.replace(TINY, block_size=8), clock)
    replicator = Replicator(source, lambda _: LocalTarget(target), clock, chunk_bytes=256 * KIB)
    source.put_blocks(writes(1))
    result = replicator.replicate(order(1))
    assert isinstance(result.error, FailedPrecondition) and "geometry" in result.message
    assert target.stats().reserved_pages == 0 and target.stats().free_pages == 4


class CorruptingTarget(LocalTarget):
    """The real target behind a link that flips one bit of the second chunk."""

    def write_chunks(self, handle, chunks, total_bytes):
        def corrupted():
            for i, chunk in enumerate(chunks):
                if i == 1:
                    sent = bytes(memoryview(chunk.data))  # a view of the staging buffer
                    data = bytes([sent[0] ^ 1]) + sent[1:]
                    chunk = dataclasses.replace(chunk, data=data)
                yield chunk
        return super().write_chunks(handle, corrupted(), total_bytes)


def test_corruption_on_the_wire_fails_and_publishes_nothing():
    clock = ManualClock(0.0)
    source = make_store(4, "a", BIG, clock)
    target = make_store(4, "b", BIG, clock)
    replicator = Replicator(source, lambda _: CorruptingTarget(target), clock, chunk_bytes=256 * KIB)
    source.put_blocks(writes(1, 2, geometry=BIG))
    result = replicator.replicate(order(1, 2))
    assert isinstance(result.error, Aborted) and "crc32c" in result.message
    assert target.lookup([1, 2]).present == [False, False] and target.stats().free_pages == 4


@pytest.mark.parametrize("bad, match", [
    (dict(order_id=""), "order_id"), (dict(target_address=""), "target_address"),
    (dict(block_hashes=()), "no block hashes"), (dict(block_hashes=(1, 1)), "repeated"),
    (dict(replica_lease_s=-1.0), "replica_lease_s"),
])
def test_invalid_orders(bad, match):
    _, _, replicator, _ = pair()
    with pytest.raises(InvalidArgument, match=match):
        replicator.replicate(dataclasses.replace(order(1), **bad))


@pytest.mark.parametrize("chunk_bytes", [255 * KIB, 4097 * KIB])
def test_chunk_size_bounds(chunk_bytes):
    with pytest.raises(InvalidArgument, match="chunk_bytes"):
        pair(chunk_bytes=chunk_bytes)


def test_what_each_transport_carried_is_counted_by_outcome():
    source, target, replicator, _ = pair(target_pages=2)
    source.put_blocks(writes(1, 2, 3, 4))
    assert replicator.replicate(order(1)).outcome is TransferOutcome.COMMITTED
    failed = replicator.replicate(dataclasses.replace(order(2, 3, 4), order_id="o2"))  # more than the target holds
    assert failed.outcome is TransferOutcome.FAILED
    carried = replicator.carried()
    transport = failed.transport
    assert carried[(transport, "committed")] == (1, TINY.bytes_per_block)
    assert carried[(transport, "failed")][0] == 1


def test_a_run_copied_from_mid_chain_lands_as_its_continuation():
    # Without its parent the target would publish blocks 3, 4 as a chain of their own, and the scheduler would
    # take block 3 for the family's root (the order carries no parent: the source knows it).
    source, target, replicator, _ = pair()
    source.put_blocks(writes(1, 2, 3, 4))
    assert replicator.replicate(order(3, 4)).outcome is TransferOutcome.COMMITTED
    committed = [e for e in retained_events(target) if e.type is EventType.COMMITTED]
    assert [(e.block_hashes, e.parent) for e in committed] == [((3, 4), 2)]
    assert replicator.replicate(dataclasses.replace(order(1, 2), order_id="o2")).outcome is TransferOutcome.COMMITTED
    assert [e.parent for e in retained_events(target) if e.type is EventType.COMMITTED][-1] is None
