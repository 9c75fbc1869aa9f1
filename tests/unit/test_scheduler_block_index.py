import pytest

from speckv.services.scheduler.block_index import BlockIndex, EventKind, IndexEvent
from speckv.services.scheduler.ids import Family, NodeId

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")


def stored(hashes, has_parent=False, family=""):
    return IndexEvent(EventKind.STORED, list(hashes), has_parent, family)


def test_stored_and_removed():
    idx = BlockIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1, 2]))
    assert idx.holders(1) == {A, B}
    assert idx.holders(3) == {A}
    idx.apply(A, IndexEvent(EventKind.REMOVED, [2]))
    assert idx.holders(2) == {B}
    assert idx.longest_prefix(A, [1, 2, 3]) == 1
    assert idx.num_blocks(A) == 2


def test_removed_of_unheld_block_is_ignored():
    idx = BlockIndex()
    idx.apply(A, IndexEvent(EventKind.REMOVED, [99]))
    assert idx.holders(99) == frozenset() and idx.num_blocks(A) == 0


def test_snapshot_replaces_inventory():
    idx = BlockIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1]))
    idx.apply(A, IndexEvent(EventKind.SNAPSHOT, [7, 8]))
    assert idx.holders(1) == {B}
    assert idx.holders(3) == frozenset()
    assert idx.holders(7) == {A}
    assert idx.num_blocks(A) == 2


def test_committed_adds_blocks():
    idx = BlockIndex()
    idx.apply(C, IndexEvent(EventKind.COMMITTED, [5, 6], has_parent=True))
    assert idx.holders(6) == {C}


@pytest.mark.parametrize("hashes,node,expected", [
    ([1, 2, 3, 4], A, 3),
    ([1, 2, 3, 4], B, 1),
    ([9, 1], A, 0),
    ([], A, 0),
])
def test_longest_prefix(hashes, node, expected):
    idx = BlockIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1, 3]))
    assert idx.longest_prefix(node, hashes) == expected


def test_prefix_lengths_matches_longest_prefix():
    idx = BlockIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1, 3]))
    idx.apply(C, stored([2, 3]))
    chain = [1, 2, 3, 4]
    assert idx.prefix_lengths(chain) == {A: 3, B: 1}
    for node in (A, B, C):
        assert idx.prefix_lengths(chain).get(node, 0) == idx.longest_prefix(node, chain)


@pytest.mark.parametrize("min_length", [0, 1, 2, 3, 4, 5])
def test_prefix_lengths_from_a_minimum_length_keeps_only_the_deeper_holders(min_length):
    idx = BlockIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1, 3]))
    idx.apply(C, stored([1, 2, 3, 4]))
    idx.apply("D", stored([2, 3, 4]))  # holds the tail, not the head: length 0
    chain = [1, 2, 3, 4]
    full = {A: 3, B: 1, C: 4}
    assert idx.prefix_lengths(chain, min_length) == {n: k for n, k in full.items() if k >= max(1, min_length)}


def test_families_follow_their_root_block():
    idx = BlockIndex()
    idx.apply(A, stored([10, 11]))  # chain root, no family: "10"
    idx.apply(B, stored([20, 21], family="doc"))
    idx.apply(C, stored([21, 22], has_parent=True, family="doc"))  # not a root
    assert idx.family_nodes(Family("10")) == {A}
    assert idx.family_nodes(Family("doc")) == {B}
    assert idx.num_families() == 2
    idx.apply(C, IndexEvent(EventKind.COMMITTED, [20], family="doc"))
    assert idx.family_nodes(Family("doc")) == {B, C}
    idx.apply(B, IndexEvent(EventKind.REMOVED, [20]))
    idx.apply(C, IndexEvent(EventKind.SNAPSHOT, []))
    assert idx.family_nodes(Family("doc")) == frozenset()
    assert idx.num_families() == 1  # forgotten once nobody holds the root


def test_note_family_only_for_held_roots_and_survives_snapshot():
    idx = BlockIndex()
    idx.note_family(Family("x"), 5)
    assert idx.num_families() == 0
    idx.apply(A, IndexEvent(EventKind.SNAPSHOT, [5, 6]))
    idx.note_family(Family("x"), 5)
    assert idx.family_nodes(Family("x")) == {A}
    idx.apply(B, IndexEvent(EventKind.SNAPSHOT, [5]))
    assert idx.family_nodes(Family("x")) == {A, B}


def test_drop_node():
    idx = BlockIndex()
    idx.apply(A, stored([1, 2]))
    idx.drop_node(A)
    assert idx.holders(1) == frozenset() and idx.num_blocks(A) == 0 and idx.num_families() == 0
