"""Known policies by name. SetPolicy accepts only these; an unknown name is
InvalidArgument listing the available ones. A known policy whose input is
missing (predictive without a forecast source, oracle without a trace, any
replicating policy without a PolicyContext) is FailedPrecondition saying
which flag supplies it."""
from __future__ import annotations

from typing import Callable

from speckv.services.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from speckv.services.scheduler.policies.affinity import AffinityPolicy
from speckv.services.scheduler.policies.base import Policy
from speckv.services.scheduler.policies.context import PolicyContext
from speckv.services.scheduler.policies.none import NonePolicy
from speckv.services.scheduler.policies.oracle import OraclePolicy
from speckv.services.scheduler.policies.predictive import PredictivePolicy
from speckv.services.scheduler.policies.reactive_heat import ReactiveHeatPolicy
from speckv.services.scheduler.policies.reactive_migrate import ReactiveMigratePolicy

PolicyFactory = Callable[[], Policy]
POLICY_NAMES = ("none", "reactive-heat", "reactive-migrate", "affinity", "predictive", "oracle")
# The policies whose plans read the predictor's forecasts (ctx.forecasts). The
# others never ask it, so a simulation of one of them need not run a predictor.
FORECAST_POLICIES = frozenset({PredictivePolicy.name})


class PolicyRegistry:
    def __init__(self) -> None:
        self._factories: dict[str, PolicyFactory] = {}
        self._descriptions: dict[str, str] = {}

    def register(self, name: str, factory: PolicyFactory, description: str = "") -> None:
        if not name:
            raise InvalidArgument("policy name is empty")
        if name in self._factories:
            raise AlreadyExists(f"policy {name!r} is already registered")
        self._factories[name] = factory
        self._descriptions[name] = description

    def available(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str) -> Policy:
        factory = self._factories.get(name)
        if factory is None:
            raise InvalidArgument(
                f"policy {name!r} is unknown; available: {', '.join(self.available())}")
        return factory()


def default_registry(context: PolicyContext | None = None) -> PolicyRegistry:
    """The six policies; those needing inputs are built from context."""
    registry = PolicyRegistry()
    registry.register(NonePolicy.name, NonePolicy, NonePolicy.description)

    def needs(name: str) -> PolicyContext:
        if context is None:
            raise FailedPrecondition(f"policy {name!r} needs the scheduler's policy context")
        return context

    def predictive() -> Policy:
        ctx = needs("predictive")
        if ctx.forecasts is None:
            raise FailedPrecondition("policy 'predictive' needs forecasts: start the scheduler with --predictor")
        return PredictivePolicy(ctx, ctx.forecasts)

    def oracle() -> Policy:
        ctx = needs("oracle")
        if ctx.future is None:
            raise FailedPrecondition("policy 'oracle' needs the true arrivals: start the scheduler with "
                                     "--oracle-trace (and --oracle-offset-s)")
        return OraclePolicy(ctx, ctx.future)

    registry.register(ReactiveHeatPolicy.name, lambda: ReactiveHeatPolicy(needs("reactive-heat")),
                      ReactiveHeatPolicy.description)
    registry.register(ReactiveMigratePolicy.name, lambda: ReactiveMigratePolicy(needs("reactive-migrate")),
                      ReactiveMigratePolicy.description)
    registry.register(AffinityPolicy.name, lambda: AffinityPolicy(needs("affinity").config.affinity),
                      AffinityPolicy.description)
    registry.register(PredictivePolicy.name, predictive, PredictivePolicy.description)
    registry.register(OraclePolicy.name, oracle, OraclePolicy.description)
    return registry
