"""The policy interface: every tick the scheduler shows the active policy a
read-only view of the cluster and submits the orders it returns.

A policy is a small object with a `name`, a one-paragraph `description` and
`plan(now, view) -> list[OrderSpec] | Plan` (a Plan also names ISSUED orders
to cancel). A policy whose plan reads no view may set `needs_view = False`;
it is then passed None instead of a view built every tick. `plan` runs on the ticker thread with
the scheduler's lock held, so it must be quick and must not do I/O; a policy
that needs remote inputs (forecasts) fetches them in `prepare(now)`, which runs
first, without the lock. The same objects run in the live cluster and in the
discrete-event simulator, so they take time only from `now`. The views they
plan from (ClusterView, NodeView, Plan) are the scheduler's vocabulary, in
views.py, which the replication planners read too.
"""
from __future__ import annotations

from typing import Protocol

from speckv.services.scheduler.orders import OrderSpec
from speckv.services.scheduler.views import ClusterView, Plan


class Policy(Protocol):
    name: str
    description: str

    def prepare(self, now: float) -> None:
        """Gathers remote inputs before plan(); runs without the scheduler lock."""
        ...

    def plan(self, now: float, view: ClusterView | None) -> "list[OrderSpec] | Plan":
        """Orders to issue now; invalid ones are logged and dropped."""
        ...
