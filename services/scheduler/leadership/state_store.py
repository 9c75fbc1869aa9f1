"""EtcdStateStore: the scheduler's durable control state (SchedulerCore's
StateJournal, and what `restore()` reads) in etcd, shared by every replica
and written only by the leader, fenced by its epoch.

It keeps what the SQLite store (adapters/state_store.py) keeps, in the same
rows (state_rows.py), under /speckv/<cluster>/state/:
    meta/schema           SCHEMA_VERSION
    meta/policy           the policy SetPolicy last chose
    meta/next_order_id    the number the next generated order id carries
    meta/finished         the last `finished` number given to a terminal order
    nodes/<node id>       a node's registration: its row as JSON
    orders/<order id>     an order: its row as JSON (block hashes: base64 of the 8-byte words)
    totals/<state>        orders that ever reached that terminal state
    transports/<s>/<t>/<k> committed copies source s -> target t over transport k
                          (each name percent-quoted): its row as JSON (schema 2)
Bounded as SQLite is: a terminal order the OrderTracker evicts is deleted in
the txn of the change that evicted it.

Invariants:
- Every journal call is one etcd txn guarded by [create_revision(leader key)
  == the epoch given to `fence()`]: all of it or none. A replica that does not
  lead at that epoch (deposed, or never fenced: epoch 0) writes nothing and
  raises FailedPrecondition (not retryable here: the call belongs to the
  leader); etcd unreachable raises Unavailable (retrying may help), as a
  failed SQLite write does. Either fails the core's call that made the change.
- `load()` is one consistent read (any replica, leader or not); a key that
  does not read back raises FailedPrecondition naming it, never a silent reset.
- The terminal counters (finished, totals) are cached from etcd after each
  fence() and after any write whose outcome is unknown (Unavailable), so an
  absolute count written is never stale.

Thread-safe (one lock); SchedulerCore calls it under its own lock anyway.
etcd keeps every revision until it compacts: run it with auto-compaction
(docs/replicas.md).
"""
from __future__ import annotations

import base64
import binascii
import json
import threading
from typing import Any, Sequence
from urllib.parse import quote

from speckv.services.common.errors import FailedPrecondition, SpeckvError
from speckv.services.common.ids import OrderId
from speckv.services.scheduler.leadership.elector import Leadership
from speckv.services.scheduler.leadership.keys import FencedKeyStore, leader_key, state_prefix
from speckv.services.scheduler.orders import Order, OrderState
from speckv.services.scheduler.ports import SavedNode, SavedState
from speckv.services.scheduler.replication.transports import Carried
from speckv.services.scheduler.state_rows import (
    CARRIED_FIELDS, NODE_FIELDS, ORDER_FIELDS, carried_from_row, carried_row, hashes_blob, node_from_row, node_row,
    order_from_row, order_row, row_finished)

SCHEMA_VERSION = 2  # 2: transports/ (a scheduler reading 1 would refuse those keys)
_BLOB = 2  # the block hashes' place in an order row


class EtcdStateStore:
    def __init__(self, keys: FencedKeyStore, cluster: str) -> None:
        self.cluster = cluster
        self._keys = keys
        self._fence_key = leader_key(cluster)
        self._prefix = state_prefix(cluster)
        self._lock = threading.Lock()
        self._epoch = 0
        self._counters: tuple[int, dict[str, int]] | None = None  # (finished, totals), None: read before writing

    def fence(self, epoch: int) -> None:
        """The epoch this replica leads at (elector's Leadership.epoch while
        is_leader); 0 when it does not lead: every write is refused."""
        if epoch < 0:
            raise ValueError(f"epoch {epoch} < 0")
        with self._lock:
            self._epoch = epoch
            self._counters = None

    def fence_from(self, leadership: Leadership) -> None:
        """fence() from an Elector's Leadership: its epoch while it leads, 0
        otherwise. A leadership listener: `elector.on_change(store.fence_from)`,
        registered before the listeners that start planning."""
        self.fence(leadership.epoch if leadership.is_leader else 0)

    @property
    def epoch(self) -> int:
        return self._epoch

    def close(self) -> None:
        """Nothing to release (the keys' connections are the caller's)."""

    # --- reading -------------------------------------------------------------
    def load(self) -> SavedState:
        """Everything saved, as SchedulerCore.restore takes it."""
        state = SavedState()
        active: list[tuple[float, str, Order]] = []
        done: list[tuple[int, Order]] = []
        for key, value in self._keys.read_prefix(self._prefix):
            name = key[len(self._prefix):]
            try:
                self._read_one(name, value, state, active, done)
            except (ValueError, TypeError, binascii.Error, SpeckvError) as exc:
                raise FailedPrecondition(f"etcd state key {key}: does not read back ({exc}); it is damaged or "
                                         "was edited by hand") from None
        state.orders = [o for _, _, o in sorted(active, key=lambda t: t[:2])] + [o for _, o in sorted(
            done, key=lambda t: (t[0], t[1].created_at, t[1].order_id))]
        state.transports.sort(key=lambda c: (c.source, c.target, c.transport))  # as SQLite's ORDER BY
        return state

    def _read_one(self, name: str, value: bytes, state: SavedState, active: list, done: list) -> None:
        kind, _, rest = name.partition("/")
        if name == "meta/schema":
            if int(value) > SCHEMA_VERSION:
                raise FailedPrecondition(f"etcd state of cluster {self.cluster!r} has schema version {int(value)}, "
                                         f"newer than this scheduler reads ({SCHEMA_VERSION})")
        elif name == "meta/policy":
            state.policy = value.decode()
        elif name == "meta/next_order_id":
            state.next_order_id = int(value)
        elif name == "meta/finished":
            int(value)
        elif kind == "nodes":
            state.nodes.append(node_from_row(_json_row(value, NODE_FIELDS)))
        elif kind == "orders":
            row = _json_row(value, ORDER_FIELDS)
            row[_BLOB] = base64.b64decode(row[_BLOB], validate=True)
            order, finished = order_from_row(row), row_finished(row)
            if finished is None:
                active.append((order.created_at, order.order_id, order))
            else:
                done.append((finished, order))
        elif kind == "totals":
            state.order_totals[OrderState(rest)] = int(value)
        elif kind == "transports":
            carried = carried_from_row(_json_row(value, CARRIED_FIELDS))
            if name != _carried_key(carried):
                raise ValueError(f"its row names {_carried_key(carried)!r}")
            state.transports.append(carried)
        else:
            raise ValueError(f"unknown key {name!r}")

    # --- the journal (SchedulerCore's StateJournal) ---------------------------
    def policy_set(self, name: str) -> None:
        self._write({"meta/policy": name.encode()})

    def node_registered(self, node: SavedNode) -> None:
        self._write({f"nodes/{node.node_id}": _json(list(node_row(node)))})

    def order_issued(self, order: Order, next_id: int) -> None:
        self._write({f"orders/{order.order_id}": _order_value(order, None),
                     "meta/next_order_id": str(next_id).encode()})

    def order_changed(self, order: Order, evicted: Sequence[OrderId]) -> None:
        with self._lock:
            finished, totals = self._read_counters()
            puts = {}
            if order.state.terminal:
                finished += 1
                totals = {**totals, order.state.value: totals.get(order.state.value, 0) + 1}
                puts = {"meta/finished": str(finished).encode(),
                        f"totals/{order.state.value}": str(totals[order.state.value]).encode()}
            if order.order_id not in evicted:  # (evicted at once: kept no more, as SQLite's insert-then-delete)
                puts[f"orders/{order.order_id}"] = _order_value(order, finished if order.state.terminal else None)
            self._txn(puts, [f"orders/{order_id}" for order_id in evicted])
            self._counters = (finished, totals)

    def transports_counted(self, rows: Sequence[Carried]) -> None:
        with self._lock:
            self._txn({_carried_key(r): _json(list(carried_row(r))) for r in rows if r.orders > 0},
                      [_carried_key(r) for r in rows if r.orders <= 0])

    # --- plumbing ------------------------------------------------------------
    def _write(self, puts: dict[str, bytes]) -> None:
        with self._lock:
            self._txn(puts, [])

    def _txn(self, puts: dict[str, bytes], deletes: list[str]) -> None:
        """One fenced txn of puts and deletes (names under the prefix); the caller holds the lock."""
        if self._epoch <= 0:
            raise FailedPrecondition(f"this scheduler does not lead cluster {self.cluster!r}: its state is "
                                     "written by the leader only")
        puts = {self._prefix + name: value for name, value in puts.items()}
        puts[self._prefix + "meta/schema"] = str(SCHEMA_VERSION).encode()
        try:
            applied = self._keys.write_fenced(self._fence_key, self._epoch, puts,
                                              [self._prefix + name for name in deletes])
        except SpeckvError:
            self._counters = None  # applied or not: unknown, so read the counts again before the next write
            raise
        if not applied:
            raise FailedPrecondition(f"this scheduler no longer leads cluster {self.cluster!r} (its epoch "
                                     f"{self._epoch} was superseded): the change was not saved")

    def _read_counters(self) -> tuple[int, dict[str, int]]:
        if self._counters is None:
            finished, totals = 0, {}
            try:
                for key, value in self._keys.read_prefix(self._prefix + "meta/finished"):
                    if key == self._prefix + "meta/finished":
                        finished = int(value)
                for key, value in self._keys.read_prefix(self._prefix + "totals/"):
                    totals[key[len(self._prefix + "totals/"):]] = int(value)
            except ValueError as exc:
                raise FailedPrecondition(f"etcd state of cluster {self.cluster!r}: a terminal count does not "
                                         f"read back ({exc})") from None
            self._counters = (finished, totals)
        return self._counters


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _json_row(value: bytes, fields: int) -> list[Any]:
    row = json.loads(value)
    if not isinstance(row, list) or len(row) != fields:
        raise ValueError(f"expected a row of {fields} fields")
    return row


def _carried_key(carried: Carried) -> str:
    """transports/<source>/<target>/<transport>, each percent-quoted (a node id may hold '/')."""
    return "transports/" + "/".join(quote(part, safe="") for part in (carried.source, carried.target,
                                                                         carried.transport))


def _order_value(order: Order, finished: int | None) -> bytes:
    row = list(order_row(order, finished))
    row[_BLOB] = base64.b64encode(hashes_blob(order.spec.block_hashes)).decode()  # JSON has no bytes
    return _json(row)
