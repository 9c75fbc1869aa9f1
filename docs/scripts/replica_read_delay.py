"""An analysis, not a policy: how long after landing a replica is first read,
by the forecast it was bought for. The issue's target counts a replica read
only within its lease (15 s); this says what share of the replicated bytes a
longer lease (or "read while resident") would count, so the decision between
them can be made on figures.

For every committed replicate order of POLICY on a synthetic slice, the first
request of the order's family routed to the order's target after the copy
committed (the replica ledger's commit time; the order's last_progress is the
transfer's start): it found a prefix there (read, at that delay from the
commit, as a lease counts) or found none (the copy was gone: evicted, or never
whole). The same first-later-request rule as the
outcome accounting's read-after-lease (services/scheduler/replication/outcomes.py);
an order whose family sent no request to the target before the slice's end
counts as never read. Bytes are the real-model bytes of the copy.

    PYTHONPATH=build/sim-compiled .venv/bin/python docs/scripts/replica_read_delay.py \
        document-bursts 16 1800 600 7 predictive
"""
import sys
from collections import defaultdict

import numpy as np
from synthetic_slice import synthetic_slice

from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import SliceView
from speckv.services.scheduler.orders import ActionKind, OrderState

DELAYS_S = (15, 30, 60, 120, 300)


Row = tuple[str, int, float | None]  # forecast, real bytes, delay from commit to first read (s; None: never)


def first_reads(scenario: str, nodes: int, start: float, duration: float, seed: int, policy: str) -> list[Row]:
    """One row per committed replica that landed fresh blocks (an order whose
    blocks were all on the target already has no commit in the ledger and no
    row; the count is printed)."""
    chosen = synthetic_slice(scenario, nodes, start, duration, seed)
    sim = Simulation(chosen.config, SimSettings.from_e2e(chosen.config, nodes=nodes), policy,
                     SliceView(chosen.workload, chosen.lo, chosen.hi), chosen.history, future=chosen.workload,
                     returns=chosen.returns)
    run = sim.run()
    records = sorted((r for r in run.records if r.served), key=lambda r: r.arrival_s)
    committed_s = {(f.order_id, f.node): f.committed_s for f in run.replicas.fates}
    by_family_node = defaultdict(list)
    for r in records:
        by_family_node[(r.family, r.node_id)].append(r)
    tracker = sim.core._orders  # an analysis script may read the tracker's log directly
    orders = [o for o in [*tracker._done.values(), *tracker._active.values()]
              if o.spec.action is ActionKind.REPLICATE and o.state is OrderState.COMMITTED]
    rows: list[Row] = []
    for o in orders:
        committed = committed_s.get((o.order_id, o.spec.target))
        if committed is None:
            continue
        later = [r for r in by_family_node.get((o.spec.family, o.spec.target), ()) if r.arrival_s >= committed]
        delay = later[0].arrival_s - committed if later and later[0].cached_tokens > 0 else None
        rows.append((o.spec.forecast or "none", len(o.spec.block_hashes) * chosen.config.real_bytes_per_block, delay))
    if len(rows) < len(orders):
        print(f"({len(orders) - len(rows)} committed replicas landed no fresh block: left out)")
    return rows


def shares(rows: list[Row]) -> dict[str, float]:
    total = sum(b for _, b, _ in rows)
    out = {f"<= {d} s": sum(b for _, b, delay in rows if delay is not None and delay <= d) / total
           for d in DELAYS_S}
    out["ever"] = sum(b for _, b, delay in rows if delay is not None) / total
    return out


def main() -> None:
    scenario, nodes, start, duration, seed, policy = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), \
        float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    rows = first_reads(scenario, nodes, start, duration, seed, policy)
    print(f"{scenario} seed {seed}, {nodes} nodes, {policy}: {len(rows)} committed replicas, "
          f"{sum(b for _, b, _ in rows) / 2**30:.0f} GiB; share of bytes first read within each delay of the commit")
    groups = {"all": rows, **{f: [r for r in rows if r[0] == f] for f in sorted({r[0] for r in rows})}}
    print("| bought for | orders | GiB | " + " | ".join(f"<= {d} s" for d in DELAYS_S) + " | ever | median delay s |")
    print("|---|---:|---:|" + "---:|" * (len(DELAYS_S) + 2))
    for name, group in groups.items():
        if not group:
            continue
        figures = shares(group)
        delays = [d for _, _, d in group if d is not None]
        median = f"{np.median(delays):.0f}" if delays else "-"
        print(f"| {name} | {len(group)} | {sum(b for _, b, _ in group) / 2**30:.0f} | "
              + " | ".join(f"{v:.2f}" for v in figures.values()) + f" | {median} |")


if __name__ == "__main__":
    main()
