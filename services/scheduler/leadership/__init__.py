"""Scheduler replicas: one elected planner and its durable state in etcd.

Every replica answers Route; exactly one (the leader) plans and issues
orders. The election follows etcd's own recipe (campaign.py): a lease kept
alive every TTL/3, a txn that creates the leader key on it only when absent,
and the key's create_revision as the epoch: strictly increasing across
leaders, carried by every order and by every write of the state, so a
deposed leader can neither act (kvstores refuse an older epoch) nor journal
(state_store.py's writes are txns guarded by the leader key's
create_revision). A leader steps down on its own before its lease could have
expired on the server (when keep-alives fail), so two replicas never both
believe they lead at the same instant of etcd's time.

Why etcd holds the durable state (policy, node registry, order log, next
order id) rather than each replica's SQLite file: any replica can take over
and must resume exactly where the deposed leader stopped, so the state must
live where every replica reads it; and etcd's txns let the one writer be
fenced by the same epoch as the election, in the same store, with no
second coordination. SQLite (adapters/state_store.py) stays the
single-process default (SoleElector).

What is NOT kept: the block index (which node holds which block) and the
nodes' loads and liveness: every replica rebuilds them from the kvstores'
event streams and heartbeats, as a restarted scheduler does.

Modules: elector.py (Leadership, the Elector interface, SoleElector),
keys.py (the etcd operations as two interfaces; the key layout),
campaign.py (the election's state machine, pure, on an injected clock),
etcd_elector.py (EtcdElector: that machine on a thread), memory_keys.py
(etcd's semantics in memory, for the simulator and the unit tests),
state_store.py (EtcdStateStore: the StateJournal in etcd, fenced);
adapters/etcd_keys.py (the interfaces over etcd3gw, failing over between
etcd's members), adapters/etcd_endpoints.py (the member list and TLS files).
"""
