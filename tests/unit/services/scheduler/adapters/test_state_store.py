"""The scheduler's durable control state: the SQLite store on its own (round
trip, refusals), the OrderTracker's journal and restore, and a SchedulerCore
resuming from what another one saved (ManualClock, no network)."""
from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import FailedPrecondition, NotFound, Unavailable
from speckv.services.common.geometry import KVGeometry, preset
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.adapters.state_store import DB_FILE, SCHEMA_VERSION, StateStore
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.ports import SavedNode, SchedulerSettings
from speckv.services.scheduler.replication.transports import Carried
from speckv.services.scheduler.orders import ActionKind, OrderSpec, OrderState, OrderTracker

GEOMETRY = KVGeometry(2, 2, 16, "float32", 4)
BIG_HASH = 2**64 - 1  # uint64: does not fit SQLite's signed INTEGER


def spec(source: str = "a", target: str = "b", hashes: tuple[int, ...] = (1, 2, 3), lease_ms: int = 10_000,
         **kw) -> OrderSpec:
    return OrderSpec(Family("f"), list(hashes), NodeId(source), NodeId(target), lease_ms, **kw)


@pytest.fixture
def store(tmp_path: Path):
    s = StateStore.open(tmp_path / "state")
    yield s
    s.close()


def reopen(store: StateStore) -> StateStore:
    store.close()
    return StateStore.open(store.path.parent)


# --- the store -------------------------------------------------------------
def test_an_empty_state_dir_is_created_with_an_empty_state(tmp_path):
    store = StateStore.open(tmp_path / "new" / "dir")
    saved = store.load()
    assert (saved.policy, saved.nodes, saved.orders, saved.next_order_id, saved.order_totals) == ("", [], [], 1, {})
    assert (tmp_path / "new" / "dir" / DB_FILE).is_file()
    store.close()


def test_policy_nodes_and_orders_read_back_as_written(store):
    store.policy_set("reactive-heat")
    store.policy_set("oracle")
    nodes = [SavedNode(NodeId("b"), "h:2", NodeSizes(64, 256, 128), preset("tiny", 16)),
             SavedNode(NodeId("a"), "h:1", NodeSizes(100), GEOMETRY)]
    for n in nodes:
        store.node_registered(n)
    store.node_registered(SavedNode(NodeId("a"), "h:9", NodeSizes(128), GEOMETRY))  # re-registered: replaces
    tracker = OrderTracker(max_retained=2, journal=store)
    first = tracker.submit(spec(hashes=(BIG_HASH, 0, 7), priority=3, expected_benefit_ms=12.5, policy="p",
                                target_address="h:2", tier=Tier.HOST), now=10.0)
    second = tracker.submit(spec(source="b", target="b", action=ActionKind.PREFETCH), now=11.0)
    tracker.report(first.order_id, OrderState.IN_FLIGHT, 12.0, "moving", bytes_sent=100, blocks_sent=1)
    done = [tracker.submit(spec(), now=13.0) for _ in range(3)]
    for order, state in zip(done, (OrderState.COMMITTED, OrderState.FAILED, OrderState.COMMITTED)):
        tracker.report(order.order_id, state, 14.0)

    saved = reopen(store).load()
    assert saved.policy == "oracle"
    assert saved.nodes == [SavedNode(NodeId("a"), "h:9", NodeSizes(128), GEOMETRY), nodes[0]]
    assert saved.nodes[1].geometry.name == "tiny"
    by_id = {o.order_id: o for o in saved.orders}
    # the oldest terminal order fell out of the retention (2), in the database too
    assert list(by_id) == [first.order_id, second.order_id, done[1].order_id, done[2].order_id]
    a = by_id[first.order_id]
    assert (a.state, a.spec.block_hashes, a.spec.tier, a.spec.priority, a.spec.expected_benefit_ms, a.spec.policy,
            a.spec.target_address, a.created_at, a.last_progress, a.message, a.bytes_sent, a.blocks_sent) == (
        OrderState.IN_FLIGHT, [BIG_HASH, 0, 7], Tier.HOST, 3, 12.5, "p", "h:2", 10.0, 12.0, "moving", 100, 1)
    assert by_id[second.order_id].spec.action is ActionKind.PREFETCH and by_id[second.order_id].spec.tier is None
    assert [by_id[o.order_id].state for o in done[1:]] == [OrderState.FAILED, OrderState.COMMITTED]
    assert saved.next_order_id == 6
    assert saved.order_totals == {OrderState.COMMITTED: 2, OrderState.FAILED: 1}


def test_a_newer_schema_is_refused(store):
    path = store.path
    store.close()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(FailedPrecondition, match=f"schema version {SCHEMA_VERSION + 1}, newer than this"):
        StateStore.open(path.parent)


# Version 1's tables as that scheduler created them (nodes without retain_max_blocks).
SCHEMA_V1 = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE nodes (
        node_id TEXT PRIMARY KEY, address TEXT NOT NULL, capacity_pages INTEGER NOT NULL,
        host_pages INTEGER NOT NULL, num_layers INTEGER NOT NULL, num_kv_heads INTEGER NOT NULL,
        head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, block_size INTEGER NOT NULL, geometry_name TEXT NOT NULL)""",
    """CREATE TABLE orders (
        order_id TEXT PRIMARY KEY, family TEXT NOT NULL, block_hashes BLOB NOT NULL, source TEXT NOT NULL,
        target TEXT NOT NULL, target_address TEXT NOT NULL, lease_ms INTEGER NOT NULL, priority INTEGER NOT NULL,
        expected_benefit_ms REAL NOT NULL, policy TEXT NOT NULL, tier TEXT, action TEXT NOT NULL,
        state TEXT NOT NULL, created_at REAL NOT NULL, last_progress REAL NOT NULL, message TEXT NOT NULL,
        bytes_sent INTEGER NOT NULL, blocks_sent INTEGER NOT NULL, finished INTEGER)""",
    "CREATE INDEX orders_finished ON orders (finished)",
    "CREATE TABLE order_totals (state TEXT PRIMARY KEY, count INTEGER NOT NULL)",
)


def test_a_version_1_database_is_migrated_keeping_its_nodes_and_policy(tmp_path):
    path = tmp_path / "state" / DB_FILE
    path.parent.mkdir()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        for sql in SCHEMA_V1:
            db.execute(sql)
        db.execute("INSERT INTO schema_version VALUES (1)")
        db.execute("INSERT INTO meta VALUES ('policy', 'oracle')")
        db.execute("INSERT INTO nodes VALUES ('a', 'h:1', 100, 400, 2, 2, 16, 'float32', 4, 'custom')")
    store = StateStore.open(path.parent)
    saved = store.load()
    assert saved.policy == "oracle"
    assert [(n.node_id, n.sizes) for n in saved.nodes] == [
        ("a", NodeSizes(100, 400, None))]  # saved before nodes reported a cap: none known
    assert saved.transports == []  # copies committed before schema 3: not counted
    store.node_registered(SavedNode(NodeId("a"), "h:1", NodeSizes(100, 400, 200), GEOMETRY))
    store.transports_counted([Carried("a", "b", "tcp", 1, 64)])
    store = reopen(store)
    assert [n.sizes.retain_max_blocks for n in store.load().nodes] == [200]
    assert store.load().transports == [Carried("a", "b", "tcp", 1, 64)]
    store.close()
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_an_unknown_older_schema_is_refused_never_reset(tmp_path):
    path = tmp_path / "state" / DB_FILE
    path.parent.mkdir()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        db.execute("INSERT INTO schema_version VALUES (0)")
    with pytest.raises(FailedPrecondition, match="schema version 0, which this scheduler cannot migrate"):
        StateStore.open(path.parent)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(0,)]


def test_a_garbage_file_is_refused_never_reset(tmp_path):
    (tmp_path / DB_FILE).write_bytes(b"not a database" * 500)
    with pytest.raises(FailedPrecondition, match="corrupt or not a database"):
        StateStore.open(tmp_path)
    assert (tmp_path / DB_FILE).read_bytes() == b"not a database" * 500


def test_an_empty_file_is_refused_never_reset(tmp_path):
    (tmp_path / DB_FILE).write_bytes(b"")
    with pytest.raises(FailedPrecondition, match=rf"{DB_FILE} is empty \(0 bytes\)"):
        StateStore.open(tmp_path)
    assert (tmp_path / DB_FILE).read_bytes() == b""  # no schema written into it


@pytest.mark.parametrize("size, expected", [
    (1, "truncated \\(1 bytes"),  # SQLite itself takes a 1-byte file for a new database
    (99, "truncated \\(99 bytes"),  # one byte short of SQLite's header
    (100, "corrupt or not a database"),  # a whole header's length: SQLite's own check refuses it
])
def test_a_file_shorter_than_a_header_is_refused_never_reset(tmp_path, size, expected):
    (tmp_path / DB_FILE).write_bytes(b"\1" * size)
    with pytest.raises(FailedPrecondition, match=expected):
        StateStore.open(tmp_path)
    assert (tmp_path / DB_FILE).read_bytes() == b"\1" * size


def test_a_missing_file_starts_an_empty_state(tmp_path):
    store = StateStore.open(tmp_path / "new")
    assert store.load().policy == ""  # nothing saved yet
    store.close()


def test_a_damaged_page_is_refused(store):
    path = store.path
    for i in range(50):
        store.node_registered(SavedNode(NodeId(f"n{i}"), f"h:{i}", NodeSizes(8), GEOMETRY))
    store.close()
    data = bytearray(path.read_bytes())
    page = 4096  # page 2: a table's b-tree root (the schema on page 1 still reads)
    data[page:page + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    with pytest.raises(FailedPrecondition, match="corrupt"):
        StateStore.open(path.parent)


def test_a_database_sqlite_reads_but_quick_check_fails_is_refused_naming_the_file(store):
    """Damage SQLite itself does not notice on open (it answers every query the
    open makes): two cells of one leaf page of the nodes table swapped, so
    its rowids are out of order. Only PRAGMA quick_check finds it."""
    path = store.path
    for i in range(300):  # enough rows for the nodes table to have leaf pages under an interior root
        store.node_registered(SavedNode(NodeId(f"n{i:04d}"), f"h:{i}", NodeSizes(8), GEOMETRY))
    store.close()
    with closing(sqlite3.connect(path)) as db:
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        leaf = db.execute("SELECT pageno FROM dbstat WHERE name = 'nodes' AND pagetype = 'leaf' AND ncell >= 2 "
                          "ORDER BY pageno LIMIT 1").fetchone()[0]
    data = bytearray(path.read_bytes())
    pointers = (leaf - 1) * page_size + 8  # a leaf page's header is 8 bytes; its cell pointer array follows
    first, second = slice(pointers, pointers + 2), slice(pointers + 2, pointers + 4)
    data[first], data[second] = data[second], data[first]
    path.write_bytes(bytes(data))
    with closing(sqlite3.connect(path)) as db:  # SQLite opens it and reads its schema without complaint
        assert db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] > 0
        assert db.execute("PRAGMA quick_check").fetchall() != [("ok",)]
    with pytest.raises(FailedPrecondition) as refused:
        StateStore.open(path.parent)
    message = str(refused.value)
    assert str(path) in message
    assert f"is corrupt (*** in database main *** On tree page {leaf} cell 0: Rowid" in message
    assert path.read_bytes() == bytes(data)  # never reset


def test_a_database_that_is_not_ours_is_refused(tmp_path):
    with closing(sqlite3.connect(tmp_path / DB_FILE, isolation_level=None)) as db:
        db.execute("CREATE TABLE something (x)")
    with pytest.raises(FailedPrecondition, match="not a speckv scheduler state database"):
        StateStore.open(tmp_path)


def test_a_row_that_does_not_read_back_is_an_error_at_load(store):
    tracker = OrderTracker(journal=store)
    tracker.submit(spec(), now=1.0)
    store._db.execute("UPDATE orders SET state = 'lost'")  # as a hand edit would
    with pytest.raises(FailedPrecondition, match="does not read back"):
        store.load()


def test_a_second_scheduler_on_the_same_dir_is_refused(store):
    with pytest.raises(FailedPrecondition, match="in use by another process"):
        StateStore.open(store.path.parent)
    store.policy_set("oracle")  # the first one still holds it
    assert store.load().policy == "oracle"


def test_a_failed_write_raises_unavailable_and_keeps_the_old_policy(store):
    clock = ManualClock(100.0)
    core = SchedulerCore(SchedulerSettings(), clock, get_profile("tiny"), state=store)
    store._db.execute("DROP TABLE meta")  # every later policy write fails
    with pytest.raises(Unavailable, match="could not be written"):
        core.set_policy("reactive-heat")
    assert core.get_policy().name == "none"


# --- the tracker ---------------------------------------------------------
def test_restore_resumes_leases_from_now_keeps_terminal_ones_and_continues_ids(store):
    tracker = OrderTracker(journal=store)
    issued, moving, committed = (tracker.submit(spec(), now=5.0) for _ in range(3))
    tracker.report(moving.order_id, OrderState.IN_FLIGHT, 6.0)
    tracker.report(committed.order_id, OrderState.COMMITTED, 6.0)
    saved = store.load()

    again = OrderTracker(max_retained=10)
    active = again.restore(saved.orders, saved.next_order_id, saved.order_totals, now=1000.0)
    assert sorted(o.order_id for o in active) == [issued.order_id, moving.order_id]
    assert all(o.last_progress == 1000.0 and o.created_at == 5.0 for o in active)
    assert again.get(committed.order_id).state is OrderState.COMMITTED
    assert again.counts()[OrderState.COMMITTED] == 1 and again.counts()[OrderState.IN_FLIGHT] == 1
    assert again.sweep(1009.9) == []  # a 10 s lease, from the restart
    assert again.report(moving.order_id, OrderState.COMMITTED, 1009.9).state is OrderState.COMMITTED
    assert again.submit(spec(), now=1010.0).order_id == "o-00000004"
    with pytest.raises(FailedPrecondition, match="empty tracker"):
        again.restore(saved.orders, 1, {}, now=0.0)


def test_restore_keeps_only_the_newest_retained_terminal_orders():
    tracker = OrderTracker()
    orders = [tracker.submit(spec(), now=1.0) for _ in range(4)]
    for o in orders:
        tracker.report(o.order_id, OrderState.FAILED, 2.0)
    small = OrderTracker(max_retained=2)
    small.restore(orders, 5, {OrderState.FAILED: 4}, now=3.0)
    with pytest.raises(NotFound):
        small.get(orders[1].order_id)
    assert small.get(orders[2].order_id).state is OrderState.FAILED
    assert small.counts()[OrderState.FAILED] == 4


# --- a core resuming -------------------------------------------------------
class Listener:
    def __init__(self):
        self.seen = []

    def node_registered(self, node_id, address, generation, old_address):
        self.seen.append((node_id, address, old_address))


def new_core(store: StateStore, clock: ManualClock, listener: Listener | None = None) -> SchedulerCore:
    return SchedulerCore(SchedulerSettings(node_timeout_s=5.0), clock, get_profile("tiny"), listener=listener,
                         state=store)


def test_a_new_core_resumes_policy_nodes_and_orders(store):
    clock = ManualClock(1000.0)
    core = new_core(store, clock)
    for n in "abc":
        core.register_node(n, f"h:{n}", NodeSizes(1000, 50 if n == "c" else 0, 25 if n == "c" else None), None)
    core.set_policy("reactive-heat")
    issued = core.submit_order(spec("a", "b"))
    moving = core.submit_order(spec("b", "c"))
    committed = core.submit_order(spec("a", "c"))
    core.report_order(moving.order_id, OrderState.IN_FLIGHT)
    core.report_order(committed.order_id, OrderState.COMMITTED)
    store = reopen(store)

    clock.advance(60.0)  # the restart took a minute: far past every lease and node timeout
    listener = Listener()
    resumed = new_core(store, clock, listener)
    resumed.restore(store.load())
    assert resumed.get_policy().name == "reactive-heat"
    assert listener.seen == [("a", "h:a", None), ("b", "h:b", None), ("c", "h:c", None)]
    state = resumed.cluster_state()
    assert [(r.view.node_id, r.view.alive, r.view.sizes.host_pages, r.view.sizes.retain_max_blocks) for r in state.nodes] == [
        ("a", False, 0, None), ("b", False, 0, None), ("c", False, 50, 25)]
    assert resumed.live_node_count() == 0
    resumed.tick()  # silent restored nodes are down already: their orders are not failed
    assert resumed.get_order(issued.order_id).state is OrderState.ISSUED
    assert resumed.get_order(moving.order_id).state is OrderState.IN_FLIGHT
    assert resumed.get_order(committed.order_id).state is OrderState.COMMITTED
    with pytest.raises(FailedPrecondition, match="is down"):
        resumed.submit_order(spec("a", "b"))

    for n in "abc":
        assert resumed.heartbeat(n, NodeLoad(free_pages=10))
    assert resumed.live_node_count() == 3
    assert resumed.report_order(moving.order_id, OrderState.COMMITTED, bytes_sent=10) is OrderState.COMMITTED
    assert resumed.report_order(committed.order_id, OrderState.COMMITTED) is OrderState.COMMITTED  # idempotent
    watcher = resumed.watch_orders("a")
    assert watcher.next(0.0).order_id == issued.order_id  # sent again to its source
    assert resumed.submit_order(spec("a", "b")).order_id == "o-00000004"

    for step in (4.9, 5.0, 0.2):  # leases (10 s) run from the restart; heartbeats keep the nodes up
        clock.advance(step)
        for n in "abc":
            resumed.heartbeat(n, NodeLoad(free_pages=10))
        resumed.tick()
        assert resumed.get_order(issued.order_id).state is (OrderState.ISSUED if step != 0.2 else OrderState.EXPIRED)


def test_the_copies_by_transport_survive_a_restart_and_count_on(store):
    clock = ManualClock(1000.0)
    core = new_core(store, clock)
    for n in "ab":
        core.register_node(n, f"h:{n}", NodeSizes(1000), None)
    for transport, nbytes in (("tcp", 100), ("tcp", 28), ("nixl", 7), ("", 3)):
        order = core.submit_order(spec("a", "b"))
        core.report_order(order.order_id, OrderState.COMMITTED, "", nbytes, 3, transport)
    before = core.cluster_state().transports
    assert before == (Carried("a", "b", "", 1, 3), Carried("a", "b", "nixl", 1, 7), Carried("a", "b", "tcp", 2, 128))
    store = reopen(store)

    resumed = new_core(store, clock)
    resumed.restore(store.load())
    assert resumed.cluster_state().transports == before
    for n in "ab":
        resumed.heartbeat(n, NodeLoad(free_pages=10))
    order = resumed.submit_order(spec("a", "b"))
    resumed.report_order(order.order_id, OrderState.COMMITTED, "", 72, 3, "tcp")
    store = reopen(store)
    assert store.load().transports == [Carried("a", "b", "", 1, 3), Carried("a", "b", "nixl", 1, 7),
                                       Carried("a", "b", "tcp", 3, 200)]
    store.close()


def test_a_saved_policy_that_cannot_run_here_leaves_the_configured_one(store):
    store.policy_set("oracle")  # needs --oracle-trace, which this core has not
    core = new_core(store, ManualClock(0.0))
    core.restore(store.load())
    assert core.get_policy().name == "none"


def test_restore_needs_an_empty_core(store):
    core = new_core(store, ManualClock(0.0))
    core.register_node("a", "h:a", NodeSizes(10), None)
    with pytest.raises(FailedPrecondition, match="no nodes and no orders"):
        core.restore(store.load())


def test_a_write_after_close_is_unavailable(tmp_path):
    store = StateStore.open(tmp_path)
    store.close()
    with pytest.raises(Unavailable):
        store.policy_set("none")
