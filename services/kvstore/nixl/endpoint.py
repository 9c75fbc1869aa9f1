"""The kvstore process's NIXL agent over its life: started with the server
when NIXL imports and --nixl is on, its host pools registered, with its
landing thread (landing.py: each transfer into a reservation checked as it
lands); both closed at stop. Until it starts (or when it cannot), `agent`
and `landing` are None: peers are told this kvstore has none (NixlMetadata
FAILED_PRECONDITION) and its own replications use tcp where they would
have used nixl.
"""
from __future__ import annotations

import logging

from speckv.services.kvstore.nixl.agent import NixlAgent
from speckv.services.kvstore.nixl.landing import NixlLanding
from speckv.services.kvstore.nixl.loader import LOADER, NixlLoader
from speckv.services.kvstore.store import KVStoreCore

log = logging.getLogger(__name__)


class NixlEndpoint:
    def __init__(self, store: KVStoreCore, enabled: bool, loader: NixlLoader = LOADER) -> None:
        self._store = store
        self._enabled = enabled
        self._loader = loader
        self.agent: NixlAgent | None = None
        self.landing: NixlLanding | None = None
        self._every_pool = False  # every tier's pool is registered (none is on a GPU)

    @property
    def source_agent(self) -> NixlAgent | None:
        """The agent for writing replicas out: only when every pool is
        registered, since a block in an unregistered (GPU) pool cannot be
        NIXL's source, and the tier is known only once the order runs."""
        return self.agent if self._every_pool else None

    def start(self) -> None:
        """Creates the agent if NIXL is there (the loader says once if not)."""
        api = self._loader.api(disabled=not self._enabled)
        pools = {tier.medium: array for tier, array in self._store.host_pools().items()}
        if api is None or not pools:
            return
        try:
            self.agent = NixlAgent(api, self._store.node_id, pools, self._store.geometry)
        except Exception as exc:  # noqa: BLE001 - NIXL's own errors: run without it, as if missing
            log.warning("NIXL agent did not start (%s: %s): --transport auto uses tcp where nixl would carry a "
                        "replication", type(exc).__name__, exc)
            return
        self.landing = NixlLanding(self.agent.notifications, self._store).start()
        self._every_pool = len(pools) == (1 if self._store.stats().host is None else 2)
        log.info("NIXL agent %s: pools %s registered%s", self.agent.name, ", ".join(pools),
                 "" if self._every_pool else "; a pool on the GPU is not, so replicas from here go by tcp")

    def stop(self) -> None:
        agent, self.agent, self._every_pool = self.agent, None, False
        landing, self.landing = self.landing, None
        if landing is not None:
            landing.stop()
        if agent is not None:
            agent.close()
