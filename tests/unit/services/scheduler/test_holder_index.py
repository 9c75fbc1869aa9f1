import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.holder_index import HolderEventKind, HolderIndex, IndexEvent

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")


def stored(hashes, has_parent=False, family=""):
    return IndexEvent(HolderEventKind.STORED, list(hashes), has_parent, family)


def test_stored_and_removed():
    idx = HolderIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1, 2]))
    assert idx.holders(1) == {A, B}
    assert idx.holders(3) == {A}
    idx.apply(A, IndexEvent(HolderEventKind.REMOVED, [2]))
    assert idx.holders(2) == {B}
    assert idx.longest_prefix(A, [1, 2, 3]) == 1
    assert idx.num_blocks(A) == 2


def test_removed_of_unheld_block_is_ignored():
    idx = HolderIndex()
    idx.apply(A, IndexEvent(HolderEventKind.REMOVED, [99]))
    assert idx.holders(99) == frozenset() and idx.num_blocks(A) == 0


def test_snapshot_replaces_inventory():
    idx = HolderIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1]))
    idx.apply(A, IndexEvent(HolderEventKind.SNAPSHOT, [7, 8]))
    assert idx.holders(1) == {B}
    assert idx.holders(3) == frozenset()
    assert idx.holders(7) == {A}
    assert idx.num_blocks(A) == 2


def test_committed_adds_blocks():
    idx = HolderIndex()
    idx.apply(C, IndexEvent(HolderEventKind.COMMITTED, [5, 6], has_parent=True))
    assert idx.holders(6) == {C}


@pytest.mark.parametrize("hashes,node,expected", [
    ([1, 2, 3, 4], A, 3),
    ([1, 2, 3, 4], B, 1),
    ([9, 1], A, 0),
    ([], A, 0),
])
def test_longest_prefix(hashes, node, expected):
    idx = HolderIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1, 3]))
    assert idx.longest_prefix(node, hashes) == expected


def test_prefix_lengths_matches_longest_prefix():
    idx = HolderIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1, 3]))
    idx.apply(C, stored([2, 3]))
    chain = [1, 2, 3, 4]
    assert idx.prefix_lengths(chain) == {A: 3, B: 1}
    for node in (A, B, C):
        assert idx.prefix_lengths(chain).get(node, 0) == idx.longest_prefix(node, chain)


def test_prefix_lengths_lists_the_shortest_prefix_first_and_walks_a_lone_holder_alone():
    idx = HolderIndex()
    idx.apply(A, stored(range(1, 9)))
    idx.apply(B, stored(range(1, 3)))
    idx.apply(C, stored(range(1, 6)))
    chain = list(range(1, 12))
    assert list(idx.prefix_lengths(chain).items()) == [(B, 2), (C, 5), (A, 8)]  # the planner reads this order
    assert idx.prefix_lengths(chain, 6) == {A: 8}  # block 6: A alone
    assert idx.prefix_lengths([50, 1]) == {} and idx.prefix_lengths([7, 8, 50]) == {A: 2}
    idx.apply(A, IndexEvent(HolderEventKind.REMOVED, [3]))
    assert idx.prefix_lengths(chain, 6) == {}  # A's prefix now ends before block 6


@pytest.mark.parametrize("min_length", [0, 1, 2, 3, 4, 5])
def test_prefix_lengths_from_a_minimum_length_keeps_only_the_deeper_holders(min_length):
    idx = HolderIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(B, stored([1, 3]))
    idx.apply(C, stored([1, 2, 3, 4]))
    idx.apply("D", stored([2, 3, 4]))  # holds the tail, not the head: length 0
    chain = [1, 2, 3, 4]
    full = {A: 3, B: 1, C: 4}
    assert idx.prefix_lengths(chain, min_length) == {n: k for n, k in full.items() if k >= max(1, min_length)}


def test_families_follow_their_root_block():
    idx = HolderIndex()
    idx.apply(A, stored([10, 11]))  # chain root, no family: "10"
    idx.apply(B, stored([20, 21], family="doc"))
    idx.apply(C, stored([21, 22], has_parent=True, family="doc"))  # not a root
    assert idx.family_nodes(Family("10")) == {A}
    assert idx.family_nodes(Family("doc")) == {B}
    assert idx.num_families() == 2
    idx.apply(C, IndexEvent(HolderEventKind.COMMITTED, [20], family="doc"))
    assert idx.family_nodes(Family("doc")) == {B, C}
    idx.apply(B, IndexEvent(HolderEventKind.REMOVED, [20]))
    idx.apply(C, IndexEvent(HolderEventKind.SNAPSHOT, []))
    assert idx.family_nodes(Family("doc")) == frozenset()
    assert idx.num_families() == 1  # forgotten once nobody holds the root


def test_note_family_only_for_held_roots_and_survives_snapshot():
    idx = HolderIndex()
    idx.note_family(Family("x"), 5)
    assert idx.num_families() == 0
    idx.apply(A, IndexEvent(HolderEventKind.SNAPSHOT, [5, 6]))
    idx.note_family(Family("x"), 5)
    assert idx.family_nodes(Family("x")) == {A}
    idx.apply(B, IndexEvent(HolderEventKind.SNAPSHOT, [5]))
    assert idx.family_nodes(Family("x")) == {A, B}


def test_drop_node():
    idx = HolderIndex()
    idx.apply(A, stored([1, 2]))
    idx.drop_node(A)
    assert idx.holders(1) == frozenset() and idx.num_blocks(A) == 0 and idx.num_families() == 0


@pytest.mark.parametrize("seed", range(6))
def test_random_events_keep_holders_inventory_and_prefixes_consistent(seed):
    """One holder is kept as the node itself, more as a set: after any mix of
    stores, removals, snapshots and drops, every reader agrees with the
    inventories (the source of truth, rebuilt here by brute force)."""
    import random

    rng = random.Random(seed)
    idx, nodes = HolderIndex(), [NodeId(f"n{i}") for i in range(5)]
    inventory = {n: set() for n in nodes}
    for _ in range(1_500):
        node, action = rng.choice(nodes), rng.random()
        hashes = rng.sample(range(30), rng.randrange(0, 6))
        if action < 0.45:
            idx.apply(node, stored(hashes, has_parent=rng.random() < 0.5, family=f"f{hashes[0] % 4}" if hashes else ""))
            inventory[node] |= set(hashes)
        elif action < 0.85:
            idx.apply(node, IndexEvent(HolderEventKind.REMOVED, hashes))
            inventory[node] -= set(hashes)
        elif action < 0.95:
            idx.apply(node, IndexEvent(HolderEventKind.SNAPSHOT, hashes))
            inventory[node] = set(hashes)
        else:
            idx.drop_node(node)
            inventory[node] = set()
        for h in range(30):
            expected = {n for n in nodes if h in inventory[n]}
            assert idx.holders(h) == expected and set(idx.holder_set(h)) == expected
        chain = rng.sample(range(30), rng.randrange(1, 8))
        for min_length in (1, 2):
            want = {n: k for n in nodes if (k := _held_prefix(inventory[n], chain)) >= min_length}
            assert idx.prefix_lengths(chain, min_length) == want
        for family in idx.families():
            assert idx.family_nodes(family) == idx.holders(idx.family_root(family))
            assert idx.family_nodes(family)  # a family is forgotten once no node holds its root


def _held_prefix(held, chain):
    count = 0
    for h in chain:
        if h not in held:
            break
        count += 1
    return count


# --- tiers -------------------------------------------------------------------------

def in_tier(kind, hashes, tier):
    return IndexEvent(kind, list(hashes), tier=tier)


def test_a_demoted_block_stays_held_and_counts_as_host_only():
    idx = HolderIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(A, in_tier(HolderEventKind.STORED, [2, 3], Tier.HOST))  # demotion: stored in the host tier...
    idx.apply(A, in_tier(HolderEventKind.REMOVED, [2, 3], Tier.DEVICE))  # ...then removed from the device tier
    assert idx.longest_prefix(A, [1, 2, 3]) == 3 and idx.holders(3) == {A}
    assert idx.host_only_count(A, [1, 2, 3], 3) == 2 and idx.host_only_count(A, [1, 2, 3], 2) == 1
    idx.apply(A, stored([2]))  # promoted: in both tiers now
    assert idx.host_only_count(A, [1, 2, 3], 3) == 1 and idx.num_host_blocks(A) == 2


def test_a_block_leaves_the_node_when_its_last_tier_drops_it():
    idx = HolderIndex()
    idx.apply(A, stored([1]))
    idx.apply(A, in_tier(HolderEventKind.STORED, [1], Tier.HOST))
    idx.apply(A, in_tier(HolderEventKind.REMOVED, [1], Tier.HOST))  # the device copy stays
    assert idx.holders(1) == {A} and idx.host_only_count(A, [1], 1) == 0
    idx.apply(A, in_tier(HolderEventKind.STORED, [1], Tier.HOST))
    idx.apply(A, in_tier(HolderEventKind.REMOVED, [1], Tier.DEVICE))
    idx.apply(A, in_tier(HolderEventKind.REMOVED, [1], Tier.HOST))
    assert idx.holders(1) == frozenset() and idx.num_blocks(A) == 0 and idx.host_only_count(A, [1], 1) == 0


def test_a_replica_committed_to_the_host_tier_is_host_only():
    idx = HolderIndex()
    idx.apply(B, IndexEvent(HolderEventKind.COMMITTED, [5, 6], family="f", tier=Tier.HOST))
    assert idx.family_nodes(Family("f")) == {B} and idx.host_only_count(B, [5, 6], 2) == 2


def test_without_host_events_no_block_is_host_only():
    idx = HolderIndex()
    idx.apply(A, stored([1, 2]))
    idx.apply(A, IndexEvent(HolderEventKind.REMOVED, [2]))
    assert idx.host_only_count(A, [1, 2], 2) == 0 and idx.num_host_blocks(A) == 0


def test_dropping_a_node_forgets_its_host_tier():
    idx = HolderIndex()
    idx.apply(A, in_tier(HolderEventKind.STORED, [1, 2], Tier.HOST))
    idx.drop_node(A)
    assert idx.holders(1) == frozenset() and idx.num_host_blocks(A) == 0
    idx.apply(A, stored([1]))
    assert idx.host_only_count(A, [1], 1) == 0


def test_medium_strings_parse_to_tiers():
    assert Tier.parse("GPU") is Tier.DEVICE and Tier.parse("") is Tier.DEVICE and Tier.parse("host") is Tier.HOST
    assert Tier.HOST.medium == "CPU"
    assert Tier.parse("disk") is Tier.DISK and Tier.parse("STORAGE") is Tier.DISK and Tier.DISK.medium == "STORAGE"
    with pytest.raises(InvalidArgument, match="unknown"):
        Tier.parse("tape")


def test_a_block_on_the_disk_tier_stays_held_below_the_device_until_the_disk_drops_it():
    idx = HolderIndex()
    idx.apply(A, stored([1, 2]))
    idx.apply(A, in_tier(HolderEventKind.STORED, [1, 2], Tier.HOST))
    idx.apply(A, in_tier(HolderEventKind.REMOVED, [1, 2], Tier.DEVICE))
    idx.apply(A, in_tier(HolderEventKind.STORED, [1, 2], Tier.DISK))  # host eviction: STORED(STORAGE)...
    idx.apply(A, in_tier(HolderEventKind.REMOVED, [1, 2], Tier.HOST))  # ...then REMOVED(CPU): still held
    assert idx.longest_prefix(A, [1, 2]) == 2 and idx.host_only_count(A, [1, 2], 2) == 2
    idx.apply(A, in_tier(HolderEventKind.REMOVED, [2], Tier.DISK))
    assert idx.holders(2) == frozenset() and idx.holders(1) == {A}


def test_a_snapshot_restores_what_the_disk_holds():
    idx = HolderIndex()
    idx.apply(A, IndexEvent(HolderEventKind.SNAPSHOT, [], disk_hashes=[7, 8]))
    assert idx.holders(7) == {A} and idx.longest_prefix(A, [7, 8]) == 2 and idx.num_device_blocks(A) == 0


def test_disk_only_counts_the_blocks_a_route_must_load_from_disk():
    idx = HolderIndex()
    idx.apply(A, stored([1, 2, 3]))
    idx.apply(A, in_tier(HolderEventKind.STORED, [1, 2, 3], Tier.HOST))
    idx.apply(A, in_tier(HolderEventKind.REMOVED, [1, 2, 3], Tier.DEVICE))
    idx.apply(A, in_tier(HolderEventKind.STORED, [2, 3], Tier.DISK))
    assert idx.disk_only_count(A, [1, 2, 3], 3) == 0  # all still in host memory
    idx.apply(A, in_tier(HolderEventKind.REMOVED, [2, 3], Tier.HOST))
    assert idx.host_only_count(A, [1, 2, 3], 3) == 3 and idx.disk_only_count(A, [1, 2, 3], 3) == 2
    assert idx.disk_only_count(A, [1, 2, 3], 2) == 1
    idx.apply(A, stored([3]))  # staged up and promoted: on the device again
    assert idx.disk_only_count(A, [1, 2, 3], 3) == 1 and idx.disk_only_count(B, [1, 2, 3], 3) == 0
