"""GetClusterState reports what each policy's speculative orders came to,
split by the forecast they were bought for: a real scheduler on loopback,
orders submitted and reported over gRPC."""
from __future__ import annotations

from rich.console import Console

from speckv.services.cluster.status import actions_table, cluster_tables
from speckv.services.scheduler.adapters.outcomes_proto import action_stats_from_proto
from speckv.v1 import common_pb2, scheduler_pb2
from tests.support.scheduler_service import register, scheduler
from tests.support.waiting import TIMEOUT

S = common_pb2
BYTES_PER_BLOCK = 2 * 2 * 2 * 16 * 16 * 4  # K and V x 2 layers x 2 heads x head_dim 16 x 16 tokens x float32


def _submit(stub, family: str, action: str = "replicate") -> str:
    target = "n1" if action == "retain" else "n2"
    order = S.ReplicationOrder(family=family, block_hashes=[1, 2, 3], source_node="n1", target_node=target,
                               lease_ms=600_000, policy="ops", expected_benefit_ms=4.0, action=action)
    return stub.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order), timeout=TIMEOUT).order_id


def _report(stub, order_id: str, state: int) -> None:
    stub.ReportOrderStatus(scheduler_pb2.OrderStatusReport(order_id=order_id, state=state), timeout=TIMEOUT)


def test_cluster_state_carries_each_policys_orders_by_action_and_outcome():
    with scheduler() as (_, stub):
        for node in ("n1", "n2"):
            register(stub, node, f"127.0.0.1:{node[1]}")
        assert list(stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).actions) == []
        cancelled, failed, landed = _submit(stub, "f1"), _submit(stub, "f2"), _submit(stub, "f3")
        _submit(stub, "f4", "retain")
        _report(stub, cancelled, S.ORDER_STATE_CANCELLED)
        _report(stub, failed, S.ORDER_STATE_FAILED)
        _report(stub, landed, S.ORDER_STATE_COMMITTED)
        state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    by_action = {a.action: a for a in state.actions}
    assert set(by_action) == {"replicate", "retain"} and {a.policy for a in state.actions} == {"ops"}
    replicate = by_action["replicate"]
    assert replicate.orders == 3 and replicate.bytes == 3 * 3 * BYTES_PER_BLOCK
    assert replicate.expected_ms == 12.0
    decided = {k: v for k, v in replicate.outcomes.items() if v}
    assert decided == {"cancelled": 1, "failed": 1}  # the committed one's lease is still running: pending
    assert [(p.forecast, p.orders) for p in replicate.by_forecast] == [("", 3)]  # an operator's: no forecast
    assert by_action["retain"].orders == 1 and by_action["retain"].bytes == 0  # counted when it commits
    assert action_stats_from_proto(replicate).to_json()["outcomes"]["failed"] == 1
    # `speckv status` prints the same per action and forecast, pending included.
    console = Console(width=250, record=True)
    console.print(actions_table(state.actions))
    rows = {cells[1]: cells for cells in ([c.strip() for c in line.split("│")[1:-1]]
                                          for line in console.export_text().splitlines() if "│ ops" in line)}
    assert rows["replicate"][2:] == ["none", "3", "0.00", "0", "0", "0", "1", "1", "1", "0.00", "0.00"]
    assert rows["retain"][2:5] == ["none", "1", "0.00"] and rows["retain"][-3:] == ["1", "-", "-"]
    # A node that registered no retention cap shows none (the planner gives it no budget either).
    assert all(not n.HasField("retain_max_blocks") for n in state.nodes)
    console = Console(width=250, record=True)
    console.print(cluster_tables(state)[0])
    node_rows = [[c.strip() for c in line.split("│")[1:-1]] for line in console.export_text().splitlines()
                 if "│ n1 " in line or "│ n2 " in line]
    assert [row[5] for row in node_rows] == ["-", "-"]
