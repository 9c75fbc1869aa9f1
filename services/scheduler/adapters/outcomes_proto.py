"""ActionStats (replication/outcomes.py) to and from speckv.v1.ActionOutcomeStats.

The scheduler packs its per-(policy, action) totals into ClusterState;
clients (the live e2e bench) unpack them into the same ActionStats, so the
simulator and a live run report actions through one to_json()."""
from __future__ import annotations

from typing import Mapping

from speckv.services.scheduler.orders import ActionKind
from speckv.services.scheduler.replication.outcomes import ActionStats
from speckv.v1 import scheduler_pb2


def actions_to_proto(stats: Mapping[tuple[str, ActionKind], ActionStats]) -> list[scheduler_pb2.ActionOutcomeStats]:
    """One message per (policy, action), in policy then action order."""
    return [_to_proto(s, policy, action.value)
            for (policy, action), s in sorted(stats.items(), key=lambda item: (item[0][0], item[0][1].value))]


def _to_proto(s: ActionStats, policy: str, action: str, forecast: str = "") -> scheduler_pb2.ActionOutcomeStats:
    return scheduler_pb2.ActionOutcomeStats(
        policy=policy, action=action, forecast=forecast, orders=s.orders, bytes=s.bytes, expected_ms=s.expected_ms,
        outcomes=s.outcomes, bytes_by_outcome=s.bytes_by_outcome, expected_ms_by_outcome=s.expected_ms_by_outcome,
        read_after_lease=s.read_after_lease, bytes_read_after_lease=s.bytes_read_after_lease,
        by_forecast=[_to_proto(part, policy, action, name) for name, part in sorted(s.by_forecast.items())])


def action_stats_from_proto(message: scheduler_pb2.ActionOutcomeStats) -> ActionStats:
    """The totals of one message (its by_forecast included); outcomes the
    sender did not name stay 0, so an older or newer scheduler still reads."""
    stats = ActionStats(orders=message.orders, bytes=message.bytes, expected_ms=message.expected_ms,
                        read_after_lease=message.read_after_lease,
                        bytes_read_after_lease=message.bytes_read_after_lease)
    stats.outcomes.update(message.outcomes)
    stats.bytes_by_outcome.update(message.bytes_by_outcome)
    stats.expected_ms_by_outcome.update(message.expected_ms_by_outcome)
    stats.by_forecast = {part.forecast: action_stats_from_proto(part) for part in message.by_forecast}
    return stats
