"""Configuration of a kvstore process (flags --field-name, env SPECKV_FIELD_NAME)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from speckv.kernels.backend import CHOICES as BACKEND_CHOICES
from speckv.services.common.config import check_port, check_positive
from speckv.services.common.discovery import parse_targets
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import PRESETS, KVGeometry, preset
from speckv.services.common.rpc.server import ServerSettings
from speckv.services.common.rpc.tls import Identity
from speckv.services.kvstore.disk.settings import check_disk
from speckv.services.kvstore.replication import MAX_CHUNK, MIN_CHUNK
from speckv.services.kvstore.vllm_encode import Encoding
from speckv.services.kvstore.vllm_publisher import DEFAULT_REPLAY_BATCHES, PublisherSettings, check_endpoint

KIB = 1024
MAX_LEASE_S = 24 * 3600.0  # what the store itself accepts (validate.lease)
MESSAGE_OVERHEAD = 64 * KIB  # room for the non-data fields of a chunk or block message
MAX_NIXL_BATCH = 64 * 1024 * KIB
TRANSPORTS = ("auto", "nixl", "tcp", "grpc")
DATA_PLANE_AUTH = ("auto", "on", "off")


@dataclass(frozen=True, slots=True)
class KVStoreConfig(ServerSettings):
    node_id: str = field(default="node-0", metadata={"help": "this node's id, unique in the cluster"})
    geometry: str = field(default="tiny", metadata={"help": f"KV geometry preset: {', '.join(PRESETS)}"})
    block_size: int = field(default=0, metadata={"help": "tokens per block; 0 keeps the preset's"})
    num_layers: int = field(default=0, metadata={"help": "override the preset's layer count (0: preset's)"})
    num_kv_heads: int = field(default=0, metadata={"help": "override the preset's KV heads (0: preset's)"})
    head_dim: int = field(default=0, metadata={"help": "override the preset's head dimension (0: preset's)"})
    dtype: str = field(default="", metadata={"help": "override the preset's dtype: float16 | bfloat16 | float32 (empty: preset's)"})
    device_pages: int = field(default=4096, metadata={"help": "blocks the device tier holds (the engine's HBM; the NumPy pool stands in on CPU)"})
    host_pages: int = field(default=0, metadata={"help": "blocks the host tier below it holds (host DRAM, pinned when a GPU is present); 0: no host tier"})
    retain_max_share: float = field(default=0.5, metadata={"help": "at most this share of the last tier's pages (host, else device) is retained by retain orders at once, in [0, 1); 0: retain orders retain nothing"})
    disk_dir: str = field(default="", metadata={"help": "directory of the disk tier below the host tier (one preallocated file of block records, read with O_DIRECT; docs/disk.md); empty: no disk tier"})
    disk_bytes: int = field(default=0, metadata={"help": "the disk tier's capacity in bytes, a multiple of one block record (4 KiB header + the block rounded up to 4 KiB); needs disk_dir and host_pages > 0"})
    disk_request_kib: int = field(default=1024, metadata={"help": "disk reads are cut into requests of this many KiB (a multiple of 4)"})
    disk_depth: int = field(default=4, metadata={"help": "disk read requests in flight at once (reader threads)"})
    disk_queue_blocks: int = field(default=256, metadata={"help": "host evictions waiting for the disk writer at most; more are dropped (counted), so the host tier never waits on the disk"})
    shared_memory: bool = field(default=True, metadata={"help": "host-memory pools live in shared memory that same-host processes of this user map (the engine connector's and same-host peers' one-copy path, docs/dataplane.md); false: private memory"})
    scheduler: str = field(default="", metadata={"help": (
        "scheduler address host:port to register with, or its replicas comma-separated (each is told of this "
        "node); an entry dns:NAME:PORT is every address NAME resolves to, re-resolved every 5 s (a Kubernetes "
        "headless Service: docs/replicas.md); empty: none")})
    advertise_address: str = field(default="", metadata={"help": "address peers reach this node at; empty: host:port"})
    heartbeat_interval_s: float = field(default=1.0, metadata={"help": "seconds between heartbeats to the scheduler (unless it asks for another)"})
    chunk_kib: int = field(default=1024, metadata={"help": "replication chunk size, KiB (256..4096)"})
    event_retention: int = field(default=100_000, metadata={"help": "KV events kept for subscribers that resume"})
    reservation_lease_s: float = field(default=10.0, metadata={"help": "lease of a replication reservation, renewed by each chunk, seconds"})
    peer_timeout_s: float = field(default=10.0, metadata={"help": "deadline of unary calls to peers and the scheduler, seconds"})
    transport: str = field(default="auto", metadata={"help": "replication data plane: auto (shared memory to a peer that shares its pools on this host, else nixl where both ends have it, else tcp), nixl (NIXL writes; tcp where an end lacks it), tcp (bulk TCP), grpc (WriteChunks only); all but grpc listen on data_port (docs/dataplane.md)"})
    nixl: bool = field(default=False, metadata={"help": "start a NIXL agent (NIXL installed), its host pools registered, so peers may write replicas with NIXL (docs/dataplane.md); off by default: starting it (the nixl import, UCX) takes seconds here (4.4 s to start instead of 0.7)"})
    nixl_batch_kib: int = field(default=8192, metadata={"help": "bytes of one NIXL transfer into a peer, KiB (256..65536, rounded down to whole blocks, at least one): each is paced by the link cap and checked by the target as it lands (docs/dataplane.md)"})
    data_port: int = field(default=0, metadata={"help": "TCP data plane port when transport is auto or tcp; 0 picks a free one"})
    backend: str = field(default="numpy", metadata={"help": f"pool memory: {' | '.join(BACKEND_CHOICES)} (auto: CuPy when a CUDA device is present)"})
    link_gbps: float = field(default=0.0, metadata={"help": "cap on replication bytes this node sends, Gbit/s (emulates a network link); 0: no cap"})
    max_reservation_lease_s: float = field(default=60.0, metadata={
        "help": "longest lease a Reserve may ask (lease_ms), seconds; longer: INVALID_ARGUMENT"})
    pin_lease_s: float = field(default=120.0, metadata={
        "help": "how long a Pin holds its blocks unless Unpin ends it first, seconds (renew: pin again, unpin once)"})
    max_family_chars: int = field(default=256, metadata={
        "help": "longest family name PutBlocks or Reserve may carry, characters; longer: INVALID_ARGUMENT"})
    data_max_connections: int = field(default=64, metadata={
        "help": "TCP data plane connections served at once; more are answered RESOURCE_EXHAUSTED and closed"})
    data_read_timeout_s: float = field(default=10.0, metadata={
        "help": "a TCP data plane connection silent this long is closed, its open writes aborted, seconds"})
    data_unauth_max_connections: int = field(default=256, metadata={
        "help": "TCP data plane connections accepted but not yet verified (no AUTH frame in) held at once; "
                "one more displaces the busiest address's oldest, or is refused (RESOURCE_EXHAUSTED)"})
    data_unauth_per_address: int = field(default=16, metadata={
        "help": "of those, at most this many from one source address; more are refused (RESOURCE_EXHAUSTED)"})
    data_auth_timeout_s: float = field(default=1.0, metadata={
        "help": "a TCP data plane connection whose opening frame (its AUTH) is not in and verified this long "
                "after its accept is closed, seconds"})
    data_plane_auth: str = field(default="auto", metadata={
        "help": "protect replication: write capabilities on every reservation write, replicas only to registered "
                "nodes' registered addresses (learned from --scheduler); auto: on exactly when TLS is on, "
                "on | off: always | never (docs/security.md)"})
    capability_ttl_s: float = field(default=300.0, metadata={
        "help": "how long a reservation's write capability stays valid after its Reserve, seconds "
                "(the reservation's lease ends it sooner when no byte arrives)"})
    kv_events_publish: str = field(default="", metadata={
        "help": "bind a ZMQ PUB socket here (tcp://HOST:PORT, tcp://*:PORT, ipc://PATH) and publish this node's "
                "KV events on it in vLLM's wire format; empty: off"})
    kv_events_replay: str = field(default="", metadata={
        "help": "bind vLLM's replay ROUTER socket here (needs kv_events_publish); empty: none"})
    kv_events_topic: str = field(default="", metadata={"help": "topic frame of each published batch"})
    kv_events_encoding: str = field(default=Encoding.TAGGED.value, metadata={
        "help": "tagged (events as maps, as current vLLM releases publish them) or array_like (positional "
                "arrays, as releases before vllm#42892 did)"})
    kv_events_replay_batches: int = field(default=DEFAULT_REPLAY_BATCHES, metadata={
        "help": "published batches kept for the replay socket; older ones are not replayed"})

    def validate(self) -> None:
        ServerSettings.validate(self)
        if not self.node_id.strip():
            raise InvalidArgument("node_id is empty")
        parse_targets(self.scheduler, "scheduler")  # names the bad entry
        tls = self.tls()
        if tls is not None and tls.identity != Identity.node(self.node_id):
            # The scheduler would refuse every RegisterNode; say so at start, naming the file.
            raise InvalidArgument(f"tls_cert={self.tls_cert}: proves {tls.identity}, not node_id={self.node_id!r} "
                                  f"({Identity.node(self.node_id).uri})")
        geometry = self.kv_geometry()  # names geometry / block_size on error
        if self.device_pages <= 0:
            raise InvalidArgument(f"device_pages={self.device_pages}: must be > 0")
        if self.host_pages < 0:
            raise InvalidArgument(f"host_pages={self.host_pages}: must be >= 0 (0: no host tier)")
        if not 0.0 <= self.retain_max_share < 1.0:
            raise InvalidArgument(f"retain_max_share={self.retain_max_share}: must be in [0, 1)")
        check_disk(self, geometry.bytes_per_block)
        if not MIN_CHUNK <= self.chunk_kib * KIB <= MAX_CHUNK:
            raise InvalidArgument(f"chunk_kib={self.chunk_kib}: must be {MIN_CHUNK // KIB}..{MAX_CHUNK // KIB}")
        if not MIN_CHUNK <= self.nixl_batch_kib * KIB <= MAX_NIXL_BATCH:
            raise InvalidArgument(f"nixl_batch_kib={self.nixl_batch_kib}: must be {MIN_CHUNK // KIB}.."
                                  f"{MAX_NIXL_BATCH // KIB}")
        largest = max(self.chunk_kib * KIB, geometry.bytes_per_block) + MESSAGE_OVERHEAD
        if largest > self.max_message_bytes:
            raise InvalidArgument(
                f"max_message_mb={self.max_message_mb}: too small for chunk_kib={self.chunk_kib} and "
                f"{geometry.bytes_per_block}-byte blocks (need {largest} bytes per message)")
        if self.event_retention <= 0:
            raise InvalidArgument(f"event_retention={self.event_retention}: must be > 0")
        check_positive("heartbeat_interval_s", self.heartbeat_interval_s)
        check_positive("reservation_lease_s", self.reservation_lease_s)
        check_positive("max_reservation_lease_s", self.max_reservation_lease_s)
        if self.reservation_lease_s > self.max_reservation_lease_s:
            raise InvalidArgument(f"reservation_lease_s={self.reservation_lease_s}: over max_reservation_lease_s="
                                  f"{self.max_reservation_lease_s} (peers set alike would refuse its Reserves)")
        if not 0 < self.pin_lease_s <= MAX_LEASE_S or not 0 < self.max_reservation_lease_s <= MAX_LEASE_S:
            raise InvalidArgument(f"pin_lease_s={self.pin_lease_s}, max_reservation_lease_s="
                                  f"{self.max_reservation_lease_s}: must be in (0, {MAX_LEASE_S:g}] seconds")
        if self.max_family_chars < 1:
            raise InvalidArgument(f"max_family_chars={self.max_family_chars}: must be >= 1")
        if self.data_max_connections < 1:
            raise InvalidArgument(f"data_max_connections={self.data_max_connections}: must be >= 1")
        check_positive("data_read_timeout_s", self.data_read_timeout_s)
        for name in ("data_unauth_max_connections", "data_unauth_per_address"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name}={getattr(self, name)}: must be >= 1")
        check_positive("data_auth_timeout_s", self.data_auth_timeout_s)
        if self.data_plane_auth not in DATA_PLANE_AUTH:
            raise InvalidArgument(f"data_plane_auth={self.data_plane_auth!r}: expected one of "
                                  f"{', '.join(DATA_PLANE_AUTH)}")
        check_positive("capability_ttl_s", self.capability_ttl_s)
        check_positive("peer_timeout_s", self.peer_timeout_s)
        if self.transport not in TRANSPORTS:
            raise InvalidArgument(f"transport={self.transport!r}: expected one of {', '.join(TRANSPORTS)}")
        check_port("data_port", self.data_port)
        if self.backend not in BACKEND_CHOICES:
            raise InvalidArgument(f"backend={self.backend!r}: expected one of {', '.join(BACKEND_CHOICES)}")
        if not self.link_gbps >= 0:
            raise InvalidArgument(f"link_gbps={self.link_gbps}: must be >= 0 (0: no cap)")
        self.kv_events_settings()

    def kv_geometry(self) -> KVGeometry:
        if self.geometry not in PRESETS:
            raise InvalidArgument(f"geometry={self.geometry!r}: expected one of {', '.join(PRESETS)}")
        if self.block_size < 0:
            raise InvalidArgument(f"block_size={self.block_size}: must be >= 0 (0 keeps the preset's)")
        base = preset(self.geometry, self.block_size)
        overrides = {name: getattr(self, name) for name in ("num_layers", "num_kv_heads", "head_dim", "dtype")
                     if getattr(self, name)}
        for name in ("num_layers", "num_kv_heads", "head_dim"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name}={getattr(self, name)}: must be >= 0 (0 keeps the preset's)")
        # A custom shape is no longer the named model: keep the preset's name only when nothing changed.
        return replace(base, name="custom", **overrides) if overrides else base

    def kv_events_settings(self) -> PublisherSettings | None:
        """The vLLM KV event publisher's settings, None when it is off;
        InvalidArgument names the kv_events_* field that is wrong."""
        encoding = Encoding.parse(self.kv_events_encoding, "kv_events_encoding")
        if self.kv_events_replay_batches <= 0:
            raise InvalidArgument(f"kv_events_replay_batches={self.kv_events_replay_batches}: must be > 0")
        if not self.kv_events_publish:
            if self.kv_events_replay:
                raise InvalidArgument(f"kv_events_replay={self.kv_events_replay!r}: needs kv_events_publish")
            return None
        check_endpoint("kv_events_publish", self.kv_events_publish)
        if self.kv_events_replay:
            check_endpoint("kv_events_replay", self.kv_events_replay)
            if self.kv_events_replay == self.kv_events_publish:
                raise InvalidArgument(f"kv_events_replay={self.kv_events_replay!r}: the same as kv_events_publish")
        return PublisherSettings(self.kv_events_publish, self.kv_events_replay, self.kv_events_topic, encoding,
                                 self.kv_events_replay_batches)

    @property
    def protected(self) -> bool:
        """Whether data_plane_auth is in force: on, or auto with TLS on."""
        if self.data_plane_auth == "auto":
            return bool(self.tls_cert or self.tls_key or self.tls_ca)
        return self.data_plane_auth == "on"

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_kib * KIB

    @property
    def nixl_batch_bytes(self) -> int:
        return self.nixl_batch_kib * KIB
