"""The scheduler's durable control state: an embedded SQLite database under
`--state-dir` (SchedulerCore's StateJournal, and what `restore()` reads).

What it keeps: the policy SetPolicy last chose, every node registration, and
the order log (every active order, the terminal ones the OrderTracker still
retains, the next generated id and the terminal totals), and the committed
copies per (source, target, transport) (`transport_totals`, from schema 3;
each written in its own transaction just after the commit that counted it,
as absolute counts). Not the block index
(rebuilt from the kvstores' event streams), loads, liveness or replica
leases: a restart learns those again within a heartbeat. The kvstores' pools
are not state at all: KV is a cache.

Invariants:
- One transaction per change (each journal call): the database is always a
  state the scheduler was in between two calls, whatever kills the process.
- Durability: WAL with synchronous=NORMAL, so a committed change survives
  the process being killed (kill -9); a power loss or kernel crash may lose
  the last changes since the WAL was last synced, never corrupt the file.
- One scheduler per database: the connection holds SQLite's exclusive lock
  (locking_mode=EXCLUSIVE) from open to close, so a second scheduler on the
  same state dir fails at start; the lock dies with its process.
- `schema_version` holds one row. An older version is migrated in place at
  open, in one transaction (MIGRATIONS). A database without it that has
  tables, a file shorter than SQLite's header (0 bytes included), one of a newer version, or one that fails SQLite's quick_check or holds a
  row that does not read back is refused at open or load with
  FailedPrecondition naming the file: never a silent reset.
- Block hashes are uint64: kept as little-endian 8-byte words in a BLOB
  (SQLite's INTEGER is signed).

Thread-safe (one lock around the connection); SchedulerCore already calls it
under its own lock. A failed write rolls back and raises Unavailable.
"""
from __future__ import annotations

import contextlib
import logging
import sqlite3
import struct
import threading
from pathlib import Path
from typing import Sequence

from speckv.services.common.errors import FailedPrecondition, SpeckvError, Unavailable
from speckv.services.common.ids import OrderId
from speckv.services.scheduler.orders import Order, OrderState
from speckv.services.scheduler.ports import SavedNode, SavedState
from speckv.services.scheduler.replication.transports import Carried
from speckv.services.scheduler.state_rows import (
    carried_from_row, carried_row, node_from_row, node_row, order_from_row, order_row)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
DB_FILE = "scheduler.db"
LOCK_WAIT_S = 1.0  # how long open() waits for another holder of the database before refusing

_TRANSPORT_TABLE = """CREATE TABLE transport_totals (
        source TEXT NOT NULL, target TEXT NOT NULL, transport TEXT NOT NULL, orders INTEGER NOT NULL,
        bytes INTEGER NOT NULL, PRIMARY KEY (source, target, transport))"""
# `finished` numbers terminal orders in the order they finished (NULL while active).
# nodes.retain_max_blocks is NULL for a node that did not report its retention cap.
SCHEMA = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",  # policy, next_order_id
    """CREATE TABLE nodes (
        node_id TEXT PRIMARY KEY, address TEXT NOT NULL, capacity_pages INTEGER NOT NULL,
        host_pages INTEGER NOT NULL, num_layers INTEGER NOT NULL, num_kv_heads INTEGER NOT NULL,
        head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, block_size INTEGER NOT NULL, geometry_name TEXT NOT NULL,
        retain_max_blocks INTEGER)""",
    """CREATE TABLE orders (
        order_id TEXT PRIMARY KEY, family TEXT NOT NULL, block_hashes BLOB NOT NULL, source TEXT NOT NULL,
        target TEXT NOT NULL, target_address TEXT NOT NULL, lease_ms INTEGER NOT NULL, priority INTEGER NOT NULL,
        expected_benefit_ms REAL NOT NULL, policy TEXT NOT NULL, tier TEXT, action TEXT NOT NULL,
        state TEXT NOT NULL, created_at REAL NOT NULL, last_progress REAL NOT NULL, message TEXT NOT NULL,
        bytes_sent INTEGER NOT NULL, blocks_sent INTEGER NOT NULL, finished INTEGER)""",
    "CREATE INDEX orders_finished ON orders (finished)",
    "CREATE TABLE order_totals (state TEXT PRIMARY KEY, count INTEGER NOT NULL)",
    _TRANSPORT_TABLE,
)
# MIGRATIONS[v]: the statements that take a version-v database to v + 1.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE nodes ADD COLUMN retain_max_blocks INTEGER",),  # nodes saved before it: not reported
    2: (_TRANSPORT_TABLE,),  # copies committed before it: not counted
}
_NODE_COLUMNS = ("node_id, address, capacity_pages, host_pages, num_layers, num_kv_heads, head_dim, dtype, "
                 "block_size, geometry_name, retain_max_blocks")
_ORDER_COLUMNS = ("order_id, family, block_hashes, source, target, target_address, lease_ms, priority, "
                  "expected_benefit_ms, policy, tier, action, state, created_at, last_progress, message, "
                  "bytes_sent, blocks_sent, finished")


class StateStore:
    """The SQLite database of one scheduler's control state. `open()` it,
    `load()` what a previous run saved, hand it to SchedulerCore as its
    journal, `close()` it on stop."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection
        self._lock = threading.Lock()
        row = self._read("SELECT COALESCE(MAX(finished), 0) FROM orders")
        self._finished = int(row[0][0])  # the last `finished` number given

    @classmethod
    def open(cls, state_dir: str | Path) -> StateStore:
        """Opens (creating if need be) state_dir/scheduler.db; FailedPrecondition
        when it is unreadable, corrupt, not ours, of a newer schema or held by
        another scheduler."""
        folder = Path(state_dir)
        path = folder / DB_FILE
        _refuse_empty_file(path)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=LOCK_WAIT_S)
        except (OSError, sqlite3.Error) as exc:
            raise FailedPrecondition(f"state dir {folder}: cannot open {path}: {exc}") from None
        try:
            _prepare(db, path)
        except BaseException:
            db.close()
            raise
        return cls(path, db)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- reading ---------------------------------------------------------
    def load(self) -> SavedState:
        """Everything saved, as SchedulerCore.restore takes it."""
        meta = dict(self._read("SELECT key, value FROM meta"))
        try:
            next_id = int(meta.get("next_order_id", "1"))
            nodes = [node_from_row(row) for row in self._read(f"SELECT {_NODE_COLUMNS} FROM nodes ORDER BY node_id")]
            orders = [order_from_row(row) for row in self._read(
                f"SELECT {_ORDER_COLUMNS} FROM orders ORDER BY finished IS NOT NULL, finished, created_at, order_id")]
            totals = {OrderState(state): int(count) for state, count in self._read(
                "SELECT state, count FROM order_totals")}
            carried = [carried_from_row(row) for row in self._read(
                "SELECT source, target, transport, orders, bytes FROM transport_totals "
                "ORDER BY source, target, transport")]
        except (ValueError, TypeError, struct.error, SpeckvError) as exc:
            raise FailedPrecondition(f"state database {self.path}: a saved row does not read back ({exc}); "
                                     "it is damaged or was edited by hand") from None
        return SavedState(meta.get("policy", ""), nodes, orders, next_id, totals, carried)

    # --- the journal (SchedulerCore's StateJournal) -----------------------
    def policy_set(self, name: str) -> None:
        self._write([("INSERT OR REPLACE INTO meta (key, value) VALUES ('policy', ?)", (name,))])

    def node_registered(self, node: SavedNode) -> None:
        self._write([(f"INSERT OR REPLACE INTO nodes ({_NODE_COLUMNS}) VALUES ({', '.join('?' * 11)})",
                      node_row(node))])

    def order_issued(self, order: Order, next_id: int) -> None:
        self._write([(f"INSERT OR REPLACE INTO orders ({_ORDER_COLUMNS}) VALUES ({', '.join('?' * 19)})",
                      order_row(order, None)),
                     ("INSERT OR REPLACE INTO meta (key, value) VALUES ('next_order_id', ?)", (str(next_id),))])

    def order_changed(self, order: Order, evicted: Sequence[OrderId]) -> None:
        with self._lock:
            finished = self._finished + 1 if order.state.terminal else None
            statements = [(f"INSERT OR REPLACE INTO orders ({_ORDER_COLUMNS}) VALUES ({', '.join('?' * 19)})",
                           order_row(order, finished))]
            if finished is not None:
                statements.append(("INSERT INTO order_totals (state, count) VALUES (?, 1) "
                                   "ON CONFLICT (state) DO UPDATE SET count = count + 1", (order.state.value,)))
            statements += [("DELETE FROM orders WHERE order_id = ?", (order_id,)) for order_id in evicted]
            self._transaction(statements)
            if finished is not None:
                self._finished = finished

    def transports_counted(self, rows: Sequence[Carried]) -> None:
        self._write([("INSERT OR REPLACE INTO transport_totals (source, target, transport, orders, bytes) "
                      "VALUES (?, ?, ?, ?, ?)", carried_row(r)) if r.orders > 0 else
                     ("DELETE FROM transport_totals WHERE source = ? AND target = ? AND transport = ?",
                      (r.source, r.target, r.transport)) for r in rows])

    # --- plumbing ----------------------------------------------------------
    def _write(self, statements: list[tuple[str, tuple[object, ...]]]) -> None:
        with self._lock:
            self._transaction(statements)

    def _transaction(self, statements: list[tuple[str, tuple[object, ...]]]) -> None:
        """Runs statements as one transaction; the caller holds the lock."""
        try:
            self._db.execute("BEGIN")
            for sql, args in statements:
                self._db.execute(sql, args)
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            try:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # a closed or broken connection: nothing was committed either way
            log.error("state database %s: write failed: %s", self.path, exc)
            raise Unavailable(f"the scheduler's state database {self.path} could not be written: {exc}") from None

    def _read(self, sql: str) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql).fetchall()
            except sqlite3.Error as exc:
                raise FailedPrecondition(f"state database {self.path}: cannot read: {exc}") from None


SQLITE_HEADER_BYTES = 100  # every SQLite database file starts with a 100-byte header


def _refuse_empty_file(path: Path) -> None:
    """A state file that exists but is shorter than SQLite's header (0 bytes: a
    truncated copy, a failed restore; SQLite takes a 1-byte file for a new
    database too) is refused, never taken for a new database: SQLite would write
    a fresh schema into it, silently dropping whatever the operator believed was
    saved there. Only a missing file starts an empty state. A scheduler killed
    between SQLite creating the file and writing its schema (a first start's
    first milliseconds) leaves a 0-byte file too: the error says how to go on."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    except OSError as exc:
        raise FailedPrecondition(f"state database {path}: cannot read it: {exc}") from None
    if size < SQLITE_HEADER_BYTES:
        what = "empty (0 bytes)" if size == 0 else f"truncated ({size} bytes, shorter than a database's header)"
        raise FailedPrecondition(f"state database {path} is {what}, so it holds no saved state and is not taken "
                                 "as a new one; move it aside (or delete it) to start with an empty state")


def _prepare(db: sqlite3.Connection, path: Path) -> None:
    """Locks, checks and (when empty) creates the schema; FailedPrecondition
    names what is wrong."""
    try:
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        db.execute("BEGIN IMMEDIATE")  # takes the write lock now, and holds it: EXCLUSIVE mode
        db.execute("COMMIT")
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        db.execute("PRAGMA synchronous=NORMAL")
        problems = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise FailedPrecondition(f"state database {path} is in use by another process (another scheduler "
                                     "on the same --state-dir?)") from None
        raise FailedPrecondition(f"state database {path} is unreadable: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise FailedPrecondition(f"state database {path} is corrupt or not a database ({exc}); move it aside "
                                 "to start with an empty state") from None
    if mode != "wal":
        raise FailedPrecondition(f"state database {path}: WAL journal mode refused (journal_mode={mode})")
    if problems != ["ok"]:
        found = "; ".join(" ".join(p.split()) for p in problems[:3])
        raise FailedPrecondition(f"state database {path} is corrupt ({found}); move it aside to start with an "
                                 "empty state")
    if not tables:
        try:
            db.execute("BEGIN")
            for sql in SCHEMA:
                db.execute(sql)
            db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise FailedPrecondition(f"state database {path}: cannot create the schema: {exc}") from None
        log.info("state database %s created (schema %d)", path, SCHEMA_VERSION)
        return
    if "schema_version" not in tables:
        raise FailedPrecondition(f"{path} is not a speckv scheduler state database (it has no schema_version "
                                 "table); point --state-dir elsewhere")
    versions = [row[0] for row in db.execute("SELECT version FROM schema_version").fetchall()]
    if len(versions) != 1 or not isinstance(versions[0], int):
        raise FailedPrecondition(f"state database {path}: schema_version holds {versions!r}, expected one number")
    if versions[0] > SCHEMA_VERSION:
        raise FailedPrecondition(f"state database {path} has schema version {versions[0]}, newer than this "
                                 f"scheduler reads ({SCHEMA_VERSION}): run the speckv that wrote it")
    if versions[0] < SCHEMA_VERSION:
        _migrate(db, path, versions[0])
    log.info("state database %s opened (schema %d)", path, SCHEMA_VERSION)


def _migrate(db: sqlite3.Connection, path: Path, version: int) -> None:
    """Takes a version-`version` database to SCHEMA_VERSION in one transaction:
    all of it or, on any error, none of it."""
    if version < 1 or any(v not in MIGRATIONS for v in range(version, SCHEMA_VERSION)):
        raise FailedPrecondition(f"state database {path} has schema version {version}, which this "
                                 f"scheduler cannot migrate (it reads {SCHEMA_VERSION})")
    try:
        db.execute("BEGIN")
        for v in range(version, SCHEMA_VERSION):
            for sql in MIGRATIONS[v]:
                db.execute(sql)
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise FailedPrecondition(f"state database {path}: cannot migrate schema {version} -> "
                                 f"{SCHEMA_VERSION}: {exc}") from None
    log.info("state database %s migrated from schema %d to %d", path, version, SCHEMA_VERSION)
