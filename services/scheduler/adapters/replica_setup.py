"""A scheduler process as one of several replicas (--etcd): the pieces the
server wires together (docs/replicas.md).

- the etcd client (leadership/adapters/etcd_keys.py), shared by the
  election and the state store;
- the shared state store (leadership/state_store.py) behind ReplicaJournal,
  so the core journals only while this replica leads;
- LeaderDuties, which turns the elector's changes into take-over and
  step-down (replica_duties.py), and ReplicaRole on top of it for the
  servicer and the ticker;
- the elector itself (EtcdElector), made once the server is bound, since it
  names this replica's address;
- RouteSharing to the --peers (route_sharing.py), leaving out this
  replica's own addresses (--advertise-address, the bound address, and what
  they resolve to), which a dns: peer entry lists too.
"""
from __future__ import annotations

from typing import Sequence

from speckv.services.common.discovery import Targets, parse_targets
from speckv.services.common.discovery_watch import own_addresses
from speckv.services.common.rpc.telemetry import Telemetry
from speckv.services.common.rpc.tls import TlsMaterial
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.replica_duties import LeaderDuties, ReplicaJournal
from speckv.services.scheduler.adapters.replica_role import ReplicaRole
from speckv.services.scheduler.adapters.route_sharing import RouteSharing
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.leadership.adapters.etcd_keys import EtcdKeys
from speckv.services.scheduler.leadership.etcd_elector import EtcdElector
from speckv.services.scheduler.leadership.state_store import EtcdStateStore
from speckv.services.scheduler.routing.observation import RouteObservation


class ReplicaSetup:
    def __init__(self, config: SchedulerConfig, telemetry: Telemetry, tls: TlsMaterial | None) -> None:
        self._config = config
        self._keys = EtcdKeys(config.etcd, tls=config.etcd_tls)
        self.store = EtcdStateStore(self._keys, config.cluster_name)
        self.duties = LeaderDuties(self.store)
        self.journal = ReplicaJournal(self.store, self.duties)
        self.role = ReplicaRole(self.duties)
        self._peers: Targets = parse_targets(config.peers, "peers")
        self._telemetry, self._tls = telemetry, tls
        self.sharing: RouteSharing | None = None
        self.elector: EtcdElector | None = None

    def attach(self, core: SchedulerCore, address: str) -> None:
        """Once the server is bound at address: the elector and the route sharing."""
        advertised = self._config.advertise_address or address
        replica_id = self._config.replica_id or advertised
        self.elector = EtcdElector(self._keys, self._config.cluster_name, replica_id, advertised,
                                   lease_s=self._config.lease_s, watch=self._keys)
        self.duties.attach(core, self.elector)
        if not self._peers.empty:
            # Resolved only for dns: peers (a static list is taken as given, as before).
            own = own_addresses({advertised, address}) if self._peers.names else {advertised, address}
            self.sharing = RouteSharing(replica_id, self._peers, self._telemetry, self._tls, exclude=own)

    def share(self, observations: Sequence[RouteObservation]) -> None:
        if self.sharing is not None and observations:
            self.sharing.share(observations)

    def start(self) -> None:
        if self.sharing is not None:
            self.sharing.start()
        if self.elector is not None:
            self.elector.start()

    def stop(self) -> None:
        """Resigns first (another replica leads at once), then stops sharing."""
        self.duties.stop()
        if self.sharing is not None:
            self.sharing.stop()
