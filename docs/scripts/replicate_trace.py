"""An analysis, not a policy: why replicas go unread. Runs POLICY on a
synthetic slice and, for every replicate order it issued, follows the
requests of the order's family from the order's creation to its lease's end:
how many came, how many went to the replica's node, how many to other nodes
(and whether they found a prefix there, and how long they queued). Each
order then falls in one class:

- read: a family request went to the target with a cached prefix;
- no demand: no request of the family came in the order's life;
- served elsewhere: requests came, none went to the target;
- target without prefix: requests went to the target but found nothing cached.

The order's life here runs from its creation to the tracker's lease end
(last_progress, the transfer's start, plus the lease), and a read counts from
the transfer's start: a second or two earlier than the outcome accounting,
whose lease starts at the commit (docs/scripts/replica_read_delay.py counts
from the commit). The tables made with it in docs/planner.md are as printed.

Beside the class, whether the copy served the family after its lease: the
first later request of the family routed to the target found a prefix
cached there (the copy stays in the target's cache past its lease, until
evicted, and routing treats it as one more holder).

    .venv/bin/python docs/scripts/replicate_trace.py document-bursts 16 1800 600 7 predictive [ACTION [OUT.jsonl]]
"""
import json
import sys
from collections import Counter, defaultdict

import numpy as np
from synthetic_slice import synthetic_slice

from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import SliceView
from speckv.services.scheduler.orders import ActionKind, OrderState

scenario, nodes, start, duration, seed, policy = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), \
    float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
kind = ActionKind[sys.argv[7].upper()] if len(sys.argv) > 7 else ActionKind.REPLICATE
chosen = synthetic_slice(scenario, nodes, start, duration, seed)
sim = Simulation(chosen.config, SimSettings.from_e2e(chosen.config, nodes=nodes), policy,
                 SliceView(chosen.workload, chosen.lo, chosen.hi), chosen.history, future=chosen.workload,
                 returns=chosen.returns)
records = [r for r in sim.run().records if r.served]
tracker = sim.core._orders  # an analysis script may read the tracker's log directly
orders = [o for o in [*tracker._done.values(), *tracker._active.values()] if o.spec.action is kind]
by_family = defaultdict(list)
for r in records:
    by_family[r.family].append(r)

classes: Counter = Counter()
expected_by_class: dict = defaultdict(float)
blocks_by_class: Counter = Counter()
served_later: Counter = Counter()  # orders not read in their lease whose copy later requests found
served_later_requests: Counter = Counter()
rows = []
for o in orders:
    if o.state is not OrderState.COMMITTED:
        classes[f"not committed ({o.state.name})"] += 1
        continue
    end = o.last_progress + o.spec.lease_ms / 1e3
    life = [r for r in by_family.get(o.spec.family, ()) if o.created_at <= r.arrival_s <= end]
    at_target = [r for r in life if r.node_id == o.spec.target]
    if any(r.cached_tokens > 0 and r.arrival_s >= o.last_progress for r in at_target):
        cls = "read"
    elif not life:
        cls = "no demand"
    elif not at_target:
        cls = "served elsewhere"
    else:
        cls = "target without prefix"
    classes[cls] += 1
    expected_by_class[cls] += o.spec.expected_benefit_ms
    blocks_by_class[cls] += len(o.spec.block_hashes)
    queue = [r.queue_ms for r in life]
    rows.append((cls, o, len(life), len(at_target), max(queue) if queue else 0.0, end - o.created_at))
    later = [r for r in by_family.get(o.spec.family, ()) if r.arrival_s > end and r.node_id == o.spec.target]
    if cls != "read" and later and later[0].cached_tokens > 0:
        served_later[cls] += 1
        served_later_requests[cls] += sum(1 for r in later if r.cached_tokens > 0)

if len(sys.argv) > 8:  # every order's class, expected saving (ms) and blocks, one JSON line each
    with open(sys.argv[8], "w") as out:
        for cls, o, *_ in rows:
            out.write(json.dumps({"class": cls, "expected_ms": o.spec.expected_benefit_ms,
                                  "blocks": len(o.spec.block_hashes)}) + "\n")
print(f"{scenario} seed {seed}, {nodes} nodes, {policy}: {len(orders)} {kind.name.lower()} orders")
for cls, n in classes.most_common():
    print(f"  {cls:28s} {n:5d}  expected saving {expected_by_class[cls] / 1e3:7.1f} s, "
          f"{blocks_by_class[cls] * chosen.config.real_bytes_per_block / 2**30:7.1f} GiB; served the family after "
          f"its lease: {served_later[cls]} ({served_later_requests[cls]} requests found a prefix there later)")
for cls in ("served elsewhere", "no demand", "target without prefix", "read"):
    chosen_rows = [row for row in rows if row[0] == cls]
    if not chosen_rows:
        continue
    life = np.array([row[2] for row in chosen_rows])
    expected = np.array([row[1].spec.expected_benefit_ms for row in chosen_rows])
    print(f"{cls}: expected saving per order, ms: quantiles 10/50/90 "
          f"{' / '.join(f'{q:.0f}' for q in np.percentile(expected, [10, 50, 90]))}")
    print(f"{cls}: family requests in the order's life: median {np.median(life):.0f}, max {life.max()}; "
          f"max queue among them: median {np.median([row[4] for row in chosen_rows]):.0f} ms; "
          f"life median {np.median([row[5] for row in chosen_rows]):.1f} s")
    for _, o, n, n_target, queue, life_s in sorted(chosen_rows, key=lambda row: -row[1].spec.expected_benefit_ms)[:6]:
        print(f"  {o.order_id} {o.spec.family} at {o.created_at:.2f} to {o.spec.target} lease "
              f"{o.spec.lease_ms / 1e3:.1f} s landed +{o.last_progress - o.created_at:.2f} s, expected "
              f"{o.spec.expected_benefit_ms:.0f} ms; {n} requests, {n_target} at the target, max queue {queue:.0f} ms")
