"""Known policies by name. SetPolicy accepts only these; an unknown name is
InvalidArgument listing the available ones. Issue 5 registers reactive,
predictive and oracle here."""
from __future__ import annotations

from typing import Callable

from speckv.services.common.errors import AlreadyExists, InvalidArgument
from speckv.services.scheduler.policies.base import Policy
from speckv.services.scheduler.policies.none import NonePolicy

PolicyFactory = Callable[[], Policy]


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


def default_registry() -> PolicyRegistry:
    registry = PolicyRegistry()
    registry.register(NonePolicy.name, NonePolicy, NonePolicy.description)
    return registry
