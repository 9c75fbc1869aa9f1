"""Configuration of the scheduler service (flags --field-name, env SPECKV_FIELD_NAME)."""
from __future__ import annotations

from dataclasses import dataclass, field

from speckv.services.common.compiled_code import MODES as COMPILED_MODES
from speckv.services.common.config import check_positive
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.discovery import parse_targets, split_host_port
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.rpc.server import ServerSettings
from speckv.services.common.traces.mooncake import FAMILY_MODES
from speckv.services.scheduler.adapters.vllm_spec import parse_kv_events
from speckv.services.scheduler.engine_liveness import LivenessRule
from speckv.services.scheduler.leadership.adapters.etcd_endpoints import EtcdTls, parse_endpoints
from speckv.services.scheduler.policies.registry import default_registry
from speckv.services.scheduler.policy_config import load_policy_config


@dataclass(frozen=True, slots=True)
class SchedulerConfig(ServerSettings):
    node_timeout_s: float = field(default=5.0, metadata={"help": "a node silent this long is down (no routes, no orders)"})
    heartbeat_interval_ms: int = field(default=1000, metadata={"help": "heartbeat interval told to nodes at registration"})
    policy: str = field(default="none", metadata={"help": "replication policy at start"})
    tick_s: float = field(default=0.25, metadata={"help": "seconds between policy ticks (also lease and liveness sweeps)"})
    predictor: str = field(default="", metadata={"help": "predictor address host:port for arrival reports; empty = off"})
    engine_profile: str = field(default="llama-3-8b-h100", metadata={"help": "prefill-time profile (services/config/engine_profiles.json)"})
    engine_profiles_path: str = field(default="", metadata={"help": "engine profiles JSON; empty = the packaged one"})
    link_gbps: float = field(default=25.0, metadata={"help": "node-to-node link bandwidth for fetch-time estimates, Gbit/s"})
    link_overhead_ms: float = field(default=1.0, metadata={"help": "fixed cost of one node-to-node transfer, ms"})
    host_link_gbps: float = field(default=0.0, metadata={"help": "each node's host<->device link (PCIe) for promotion-time estimates, Gbit/s; 0: host tiers are not priced"})
    host_link_overhead_ms: float = field(default=0.0, metadata={"help": "fixed cost of one promotion copy, ms"})
    disk_gbps: float = field(default=0.0, metadata={"help": "each node's disk-tier reads (the whole engine's) for disk-load estimates, Gbit/s (services/config/disks.json: GB/s x 8); 0: disk blocks are priced as host hits"})
    disk_overhead_ms: float = field(default=0.0, metadata={"help": "fixed cost of one disk load, ms"})
    lookup_timeout_s: float = field(default=0.2, metadata={"help": "deadline of Route's confirming KVStore.Lookup, s"})
    policies_path: str = field(default="", metadata={"help": "policy/planner thresholds JSON; empty = the committed services/config/policies.json"})
    oracle_trace: str = field(default="", metadata={"help": "Mooncake-format trace the oracle policy reads the true future from; empty = no oracle"})
    oracle_family: str = field(default="prefix", metadata={"help": "how the oracle keys the trace's families: prefix (first block id) or conversation (first two); must match the families routers send"})
    oracle_offset_s: float = field(default=0.0, metadata={"help": "scheduler clock time at which the oracle trace's t=0 falls, s"})
    forecast_timeout_s: float = field(default=1.0, metadata={"help": "deadline of one predictor Forecast call, s"})
    loss_probe_s: float = field(default=1.0, metadata={"help": (
        "when a node's kvstore event stream closes, the scheduler reconnects at once and waits this long: refused "
        "means the node is down now, before its heartbeat timeout (docs/failover.md); 0 = off")})
    confirm_routes: bool = field(default=True, metadata={"help": "confirm each routed prefix with the chosen kvstore (one Lookup per Route)"})
    router_seed: int = field(default=0, metadata={"help": "seed of the router's tie-break RNG"})
    tie_ms: float = field(default=1.0, metadata={"help": "expected TTFTs this close (ms) count as a tie and are spread"})
    arrival_queue: int = field(default=10000, metadata={"help": "arrival reports buffered for the predictor before dropping"})
    predictor_timeout_s: float = field(default=2.0, metadata={"help": "deadline of one ObserveArrivals batch, s"})
    # Engine profiles name no context length yet; 256 Ki tokens admits every prompt of the committed
    # Mooncake traces, which the live experiments route, while a uint32's 4 Gi cannot be booked.
    max_prompt_tokens: int = field(default=262_144, metadata={
        "help": "largest prompt_tokens a Route may carry (the served model's context); larger: INVALID_ARGUMENT"})
    max_family_chars: int = field(default=256, metadata={
        "help": "longest family name a Route or SubmitOrder may carry, characters; longer: INVALID_ARGUMENT"})
    state_dir: str = field(default="", metadata={"help": (
        "folder of the durable control state (policy, order log, node registry; SQLite scheduler.db), so a "
        "restart resumes where it stopped; empty = memory only")})
    kv_events: str = field(default="", metadata={"help": (
        "vLLM engines to index from their ZMQ KV events: entries separated by ';', each "
        "NODE=tcp://HOST:PORT (vLLM's PUB endpoint) with optional ,replay=tcp://HOST:PORT (its replay ROUTER), "
        ",address=HOST:PORT (what Route answers; default the PUB's), ,pages=N (its KV blocks), ,topic=T, "
        ",digest=HEX (its layout digest, which SpeckvConnector logs: its blocks are then indexed under the "
        "ids routers send; else under vLLM's own), ,kvstore=1 (a kvstore registers this node: the engine's "
        "events join its kvstore's as a second source, no address= or pages=), ,health=http://HOST:PORT/health "
        "(the engine's OpenAI server, probed every engine_health_interval_s: after engine_health_failures "
        "failures in a row the engine is dead and its blocks leave the index; beside a kvstore its kvstore's stay, "
        "an engine-only node goes down; it comes back empty when the probe answers again); "
        "empty = none")})
    engine_health_interval_s: float = field(default=1.0, metadata={
        "help": "seconds between two health probes of a --kv-events engine named with health="})
    engine_health_timeout_s: float = field(default=2.0, metadata={
        "help": "a health probe not answered 2xx within this many seconds has failed"})
    engine_health_failures: int = field(default=3, metadata={
        "help": "failed health probes in a row that make a --kv-events engine dead (its blocks dropped)"})
    etcd: str = field(default="", metadata={"help": (
        "the etcd cluster where scheduler replicas elect the one that plans and keep the shared control state "
        "(docs/replicas.md): its members' client URLs, comma-separated, each http://HOST:PORT or "
        "https://HOST:PORT (a dead member is passed over for the next); empty = a single scheduler (no election)")})
    etcd_ca: str = field(default="", metadata={"help": (
        "https etcd: the CA certificate (PEM) that signed the members' certificates; empty = the system's CAs")})
    etcd_cert: str = field(default="", metadata={"help": (
        "https etcd: this scheduler's client certificate (PEM), for an etcd run with --client-cert-auth")})
    etcd_key: str = field(default="", metadata={"help": "the private key of etcd_cert (PEM)"})
    replica_id: str = field(default="", metadata={"help": "this replica's name in the election; empty = host:port"})
    advertise_address: str = field(default="", metadata={"help": (
        "host:port the other replicas and tools reach this replica at (the leader key names it; a dns: peer "
        "equal to it is this replica itself); empty = host:port bound")})
    peers: str = field(default="", metadata={"help": (
        "the other replicas' gRPC addresses, comma-separated: each routed request's planner-facing effects are "
        "shared with them (ShareRoutes); an entry dns:NAME:PORT is every address NAME resolves to but this "
        "replica's own, re-resolved every 5 s (a Kubernetes headless Service: docs/replicas.md); empty = none")})
    lease_s: int = field(default=2, metadata={"help": (
        "the leader's etcd lease, whole seconds (etcd's unit; its floor is 2 s at etcd's default timing): a dead "
        "leader is replaced within two of these")})
    cluster_name: str = field(default="speckv", metadata={"help": "the etcd key prefix of this cluster's election and state"})
    compiled: str = field(default="auto", metadata={"help": (
        "run on the mypyc-compiled build of the hot modules (the holder index, the router, the core; `make "
        "sim-compiled` builds it): auto = when it matches this source, on = or refuse to start, off = the "
        "source (docs/scale.md)")})
    compiled_dir: str = field(default="", metadata={"help": "where the compiled build is; empty = build/sim-compiled at the project root"})

    @property
    def etcd_tls(self) -> EtcdTls:
        return EtcdTls(self.etcd_ca, self.etcd_cert, self.etcd_key)

    def engine_health(self) -> LivenessRule:
        """How engines named with health= are probed; InvalidArgument names the bad field."""
        try:
            return LivenessRule(self.engine_health_interval_s, self.engine_health_timeout_s,
                                self.engine_health_failures)
        except ValueError as exc:
            raise InvalidArgument(f"{exc} (engine_health_interval_s, engine_health_timeout_s, "
                                  "engine_health_failures)") from None

    def validate(self) -> None:
        ServerSettings.validate(self)
        for name in ("node_timeout_s", "tick_s", "link_gbps", "lookup_timeout_s", "predictor_timeout_s",
                     "forecast_timeout_s"):
            check_positive(name, getattr(self, name))
        if self.heartbeat_interval_ms <= 0:
            raise InvalidArgument(f"heartbeat_interval_ms={self.heartbeat_interval_ms}: must be > 0")
        if self.heartbeat_interval_ms >= self.node_timeout_s * 1000:
            raise InvalidArgument(f"heartbeat_interval_ms={self.heartbeat_interval_ms}: must be shorter "
                                  f"than node_timeout_s={self.node_timeout_s}")
        if not self.host_link_gbps >= 0 or not self.host_link_overhead_ms >= 0:
            raise InvalidArgument(f"host_link_gbps={self.host_link_gbps}, host_link_overhead_ms="
                                  f"{self.host_link_overhead_ms}: must be >= 0 (host_link_gbps 0: not priced)")
        if not self.disk_gbps >= 0 or not self.disk_overhead_ms >= 0:
            raise InvalidArgument(f"disk_gbps={self.disk_gbps}, disk_overhead_ms={self.disk_overhead_ms}: "
                                  "must be >= 0 (disk_gbps 0: not priced)")
        if self.disk_gbps > 0 and self.host_link_gbps <= 0:
            raise InvalidArgument(f"disk_gbps={self.disk_gbps} needs host_link_gbps > 0: a disk load lands in "
                                  "the host tier and crosses the host link")
        if not self.loss_probe_s >= 0:
            raise InvalidArgument(f"loss_probe_s={self.loss_probe_s}: must be >= 0 (0: off)")
        if self.link_overhead_ms < 0:
            raise InvalidArgument(f"link_overhead_ms={self.link_overhead_ms}: must be >= 0")
        if self.tie_ms < 0:
            raise InvalidArgument(f"tie_ms={self.tie_ms}: must be >= 0")
        for name in ("max_prompt_tokens", "max_family_chars"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name}={getattr(self, name)}: must be >= 1")
        if self.arrival_queue <= 0:
            raise InvalidArgument(f"arrival_queue={self.arrival_queue}: must be > 0")
        if self.predictor and ":" not in self.predictor:
            raise InvalidArgument(f"predictor={self.predictor!r}: expected host:port or empty")
        registry = default_registry()
        if self.policy not in registry.available():
            raise InvalidArgument(f"policy={self.policy!r} is unknown; available: {', '.join(registry.available())}")
        get_profile(self.engine_profile, self.engine_profiles_path or None)
        load_policy_config(self.policies_path or None)
        if self.policy == "predictive" and not self.predictor:
            raise InvalidArgument("policy='predictive' needs --predictor (where forecasts come from)")
        if self.oracle_family not in FAMILY_MODES:
            raise InvalidArgument(f"oracle_family={self.oracle_family!r}: expected one of {', '.join(FAMILY_MODES)}")
        parse_kv_events(self.kv_events)
        self.engine_health()
        if self.compiled not in COMPILED_MODES:
            raise InvalidArgument(f"compiled={self.compiled!r}: expected one of {', '.join(COMPILED_MODES)}")
        if self.etcd and self.state_dir:
            raise InvalidArgument("etcd and state_dir are exclusive: with --etcd the control state lives in etcd, "
                                  "where every replica can take over")
        if (self.peers or self.replica_id or self.advertise_address) and not self.etcd:
            raise InvalidArgument("peers, replica_id and advertise_address are for scheduler replicas, which "
                                  "need --etcd")
        if self.etcd:
            parse_endpoints(self.etcd, self.etcd_tls)
            self.etcd_tls.check()
        elif not self.etcd_tls.empty:
            raise InvalidArgument("etcd_ca, etcd_cert and etcd_key are for --etcd (an https etcd)")
        parse_targets(self.peers, "peers")  # names the bad entry
        if self.advertise_address:
            split_host_port(self.advertise_address, "advertise_address")
        if self.etcd and not 2 <= self.lease_s <= 60:
            raise InvalidArgument(f"lease_s={self.lease_s}: expected 2..60 whole seconds")
        if not self.cluster_name or "/" in self.cluster_name:
            raise InvalidArgument(f"cluster_name={self.cluster_name!r}: a non-empty name without '/'")
        if self.policy == "oracle" and not self.oracle_trace:
            raise InvalidArgument("policy='oracle' needs --oracle-trace (the true future arrivals)")
