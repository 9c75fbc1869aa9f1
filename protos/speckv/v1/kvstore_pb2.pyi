from speckv.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KVEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_EVENT_TYPE_UNSPECIFIED: _ClassVar[KVEventType]
    KV_EVENT_TYPE_STORED: _ClassVar[KVEventType]
    KV_EVENT_TYPE_REMOVED: _ClassVar[KVEventType]
    KV_EVENT_TYPE_COMMITTED: _ClassVar[KVEventType]
    KV_EVENT_TYPE_SNAPSHOT: _ClassVar[KVEventType]
KV_EVENT_TYPE_UNSPECIFIED: KVEventType
KV_EVENT_TYPE_STORED: KVEventType
KV_EVENT_TYPE_REMOVED: KVEventType
KV_EVENT_TYPE_COMMITTED: KVEventType
KV_EVENT_TYPE_SNAPSHOT: KVEventType

class LookupRequest(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("present", "prefix_blocks")
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[bool]
    prefix_blocks: int
    def __init__(self, present: _Optional[_Iterable[bool]] = ..., prefix_blocks: _Optional[int] = ...) -> None: ...

class PutBlockRequest(_message.Message):
    __slots__ = ("block_hash", "data", "family", "parent_hash", "has_parent")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    HAS_PARENT_FIELD_NUMBER: _ClassVar[int]
    block_hash: int
    data: bytes
    family: str
    parent_hash: int
    has_parent: bool
    def __init__(self, block_hash: _Optional[int] = ..., data: _Optional[bytes] = ..., family: _Optional[str] = ..., parent_hash: _Optional[int] = ..., has_parent: _Optional[bool] = ...) -> None: ...

class PutBlocksResponse(_message.Message):
    __slots__ = ("stored", "already_present", "evicted")
    STORED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    already_present: int
    evicted: int
    def __init__(self, stored: _Optional[int] = ..., already_present: _Optional[int] = ..., evicted: _Optional[int] = ...) -> None: ...

class GetBlocksRequest(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class BlockData(_message.Message):
    __slots__ = ("block_hash", "data", "crc32c")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    block_hash: int
    data: bytes
    crc32c: int
    def __init__(self, block_hash: _Optional[int] = ..., data: _Optional[bytes] = ..., crc32c: _Optional[int] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("changed",)
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: int
    def __init__(self, changed: _Optional[int] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class PromoteResponse(_message.Message):
    __slots__ = ("promoted",)
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    promoted: int
    def __init__(self, promoted: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("node_id", "geometry", "num_pages", "used_pages", "free_pages", "pinned_pages", "reserved_pages", "replica_pages", "pool_bytes", "last_event_sequence", "blocks_stored_total", "blocks_evicted_total", "blocks_committed_total", "host_pages", "host_used_pages", "host_free_pages", "host_pinned_pages", "host_replica_pages", "host_pool_bytes", "blocks_demoted_total", "blocks_promoted_total", "blocks_dropped_total", "retained_blocks", "retain_max_blocks", "disk_pages", "disk_used_pages", "disk_free_pages", "disk_pool_bytes", "disk_counters", "order_counters")
    class DiskCountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class OrderCountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    USED_PAGES_FIELD_NUMBER: _ClassVar[int]
    FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    PINNED_PAGES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_PAGES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_PAGES_FIELD_NUMBER: _ClassVar[int]
    POOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_STORED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_EVICTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_COMMITTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HOST_PAGES_FIELD_NUMBER: _ClassVar[int]
    HOST_USED_PAGES_FIELD_NUMBER: _ClassVar[int]
    HOST_FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    HOST_PINNED_PAGES_FIELD_NUMBER: _ClassVar[int]
    HOST_REPLICA_PAGES_FIELD_NUMBER: _ClassVar[int]
    HOST_POOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_DEMOTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_PROMOTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RETAINED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RETAIN_MAX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DISK_PAGES_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_PAGES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    DISK_POOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    ORDER_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    geometry: _common_pb2.KVGeometry
    num_pages: int
    used_pages: int
    free_pages: int
    pinned_pages: int
    reserved_pages: int
    replica_pages: int
    pool_bytes: int
    last_event_sequence: int
    blocks_stored_total: int
    blocks_evicted_total: int
    blocks_committed_total: int
    host_pages: int
    host_used_pages: int
    host_free_pages: int
    host_pinned_pages: int
    host_replica_pages: int
    host_pool_bytes: int
    blocks_demoted_total: int
    blocks_promoted_total: int
    blocks_dropped_total: int
    retained_blocks: int
    retain_max_blocks: int
    disk_pages: int
    disk_used_pages: int
    disk_free_pages: int
    disk_pool_bytes: int
    disk_counters: _containers.ScalarMap[str, int]
    order_counters: _containers.ScalarMap[str, int]
    def __init__(self, node_id: _Optional[str] = ..., geometry: _Optional[_Union[_common_pb2.KVGeometry, _Mapping]] = ..., num_pages: _Optional[int] = ..., used_pages: _Optional[int] = ..., free_pages: _Optional[int] = ..., pinned_pages: _Optional[int] = ..., reserved_pages: _Optional[int] = ..., replica_pages: _Optional[int] = ..., pool_bytes: _Optional[int] = ..., last_event_sequence: _Optional[int] = ..., blocks_stored_total: _Optional[int] = ..., blocks_evicted_total: _Optional[int] = ..., blocks_committed_total: _Optional[int] = ..., host_pages: _Optional[int] = ..., host_used_pages: _Optional[int] = ..., host_free_pages: _Optional[int] = ..., host_pinned_pages: _Optional[int] = ..., host_replica_pages: _Optional[int] = ..., host_pool_bytes: _Optional[int] = ..., blocks_demoted_total: _Optional[int] = ..., blocks_promoted_total: _Optional[int] = ..., blocks_dropped_total: _Optional[int] = ..., retained_blocks: _Optional[int] = ..., retain_max_blocks: _Optional[int] = ..., disk_pages: _Optional[int] = ..., disk_used_pages: _Optional[int] = ..., disk_free_pages: _Optional[int] = ..., disk_pool_bytes: _Optional[int] = ..., disk_counters: _Optional[_Mapping[str, int]] = ..., order_counters: _Optional[_Mapping[str, int]] = ...) -> None: ...

class SubscribeEventsRequest(_message.Message):
    __slots__ = ("after_sequence",)
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    def __init__(self, after_sequence: _Optional[int] = ...) -> None: ...

class KVEvent(_message.Message):
    __slots__ = ("sequence", "type", "block_hashes", "parent_hash", "has_parent", "block_size", "family", "node_id", "time_s", "order_id", "medium", "host_block_hashes", "disk_block_hashes")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    HAS_PARENT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    HOST_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    DISK_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    type: KVEventType
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    parent_hash: int
    has_parent: bool
    block_size: int
    family: str
    node_id: str
    time_s: float
    order_id: str
    medium: str
    host_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    disk_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sequence: _Optional[int] = ..., type: _Optional[_Union[KVEventType, str]] = ..., block_hashes: _Optional[_Iterable[int]] = ..., parent_hash: _Optional[int] = ..., has_parent: _Optional[bool] = ..., block_size: _Optional[int] = ..., family: _Optional[str] = ..., node_id: _Optional[str] = ..., time_s: _Optional[float] = ..., order_id: _Optional[str] = ..., medium: _Optional[str] = ..., host_block_hashes: _Optional[_Iterable[int]] = ..., disk_block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class ReplicateRequest(_message.Message):
    __slots__ = ("order", "chunk_bytes", "transport", "pull")
    ORDER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    order: _common_pb2.ReplicationOrder
    chunk_bytes: int
    transport: str
    pull: bool
    def __init__(self, order: _Optional[_Union[_common_pb2.ReplicationOrder, _Mapping]] = ..., chunk_bytes: _Optional[int] = ..., transport: _Optional[str] = ..., pull: _Optional[bool] = ...) -> None: ...

class ReplicateResponse(_message.Message):
    __slots__ = ("order_id", "state", "blocks_sent", "blocks_skipped", "bytes_sent", "seconds", "message", "transport")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_SENT_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    state: _common_pb2.OrderState
    blocks_sent: int
    blocks_skipped: int
    bytes_sent: int
    seconds: float
    message: str
    transport: str
    def __init__(self, order_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.OrderState, str]] = ..., blocks_sent: _Optional[int] = ..., blocks_skipped: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., seconds: _Optional[float] = ..., message: _Optional[str] = ..., transport: _Optional[str] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("order_id", "block_hashes", "lease_ms", "source_node", "family", "parent_hash", "has_parent", "medium", "shared_memory", "engine_save", "pull", "nixl")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NODE_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    HAS_PARENT_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SAVE_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    NIXL_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    lease_ms: int
    source_node: str
    family: str
    parent_hash: int
    has_parent: bool
    medium: str
    shared_memory: bool
    engine_save: bool
    pull: bool
    nixl: bool
    def __init__(self, order_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., lease_ms: _Optional[int] = ..., source_node: _Optional[str] = ..., family: _Optional[str] = ..., parent_hash: _Optional[int] = ..., has_parent: _Optional[bool] = ..., medium: _Optional[str] = ..., shared_memory: _Optional[bool] = ..., engine_save: _Optional[bool] = ..., pull: _Optional[bool] = ..., nixl: _Optional[bool] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("handle", "block_hashes", "bytes_per_block", "lease_deadline_s", "data_address", "capability", "capability_secret", "pages", "pages_medium", "pages_token")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_SECRET_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGES_MEDIUM_FIELD_NUMBER: _ClassVar[int]
    PAGES_TOKEN_FIELD_NUMBER: _ClassVar[int]
    handle: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    bytes_per_block: int
    lease_deadline_s: float
    data_address: str
    capability: bytes
    capability_secret: bytes
    pages: _containers.RepeatedScalarFieldContainer[int]
    pages_medium: str
    pages_token: str
    def __init__(self, handle: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., bytes_per_block: _Optional[int] = ..., lease_deadline_s: _Optional[float] = ..., data_address: _Optional[str] = ..., capability: _Optional[bytes] = ..., capability_secret: _Optional[bytes] = ..., pages: _Optional[_Iterable[int]] = ..., pages_medium: _Optional[str] = ..., pages_token: _Optional[str] = ...) -> None: ...

class WriteChunkRequest(_message.Message):
    __slots__ = ("handle", "offset", "data", "crc32c", "capability", "capability_secret")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_SECRET_FIELD_NUMBER: _ClassVar[int]
    handle: str
    offset: int
    data: bytes
    crc32c: int
    capability: bytes
    capability_secret: bytes
    def __init__(self, handle: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., crc32c: _Optional[int] = ..., capability: _Optional[bytes] = ..., capability_secret: _Optional[bytes] = ...) -> None: ...

class WriteChunksResponse(_message.Message):
    __slots__ = ("bytes_received",)
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    bytes_received: int
    def __init__(self, bytes_received: _Optional[int] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("handle", "chunk_crc32c", "replica_lease_ms", "capability", "capability_secret", "shared_memory", "segment_crc32c", "nixl_batches")
    class ChunkCrc32cEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CRC32C_FIELD_NUMBER: _ClassVar[int]
    REPLICA_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_SECRET_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_CRC32C_FIELD_NUMBER: _ClassVar[int]
    NIXL_BATCHES_FIELD_NUMBER: _ClassVar[int]
    handle: str
    chunk_crc32c: _containers.ScalarMap[int, int]
    replica_lease_ms: int
    capability: bytes
    capability_secret: bytes
    shared_memory: bool
    segment_crc32c: _containers.RepeatedScalarFieldContainer[int]
    nixl_batches: bool
    def __init__(self, handle: _Optional[str] = ..., chunk_crc32c: _Optional[_Mapping[int, int]] = ..., replica_lease_ms: _Optional[int] = ..., capability: _Optional[bytes] = ..., capability_secret: _Optional[bytes] = ..., shared_memory: _Optional[bool] = ..., segment_crc32c: _Optional[_Iterable[int]] = ..., nixl_batches: _Optional[bool] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("blocks_committed",)
    BLOCKS_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    blocks_committed: int
    def __init__(self, blocks_committed: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("handle", "reason", "capability", "capability_secret")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_SECRET_FIELD_NUMBER: _ClassVar[int]
    handle: str
    reason: str
    capability: bytes
    capability_secret: bytes
    def __init__(self, handle: _Optional[str] = ..., reason: _Optional[str] = ..., capability: _Optional[bytes] = ..., capability_secret: _Optional[bytes] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("pages_freed",)
    PAGES_FREED_FIELD_NUMBER: _ClassVar[int]
    pages_freed: int
    def __init__(self, pages_freed: _Optional[int] = ...) -> None: ...

class OpenSharedPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SharedPool(_message.Message):
    __slots__ = ("medium", "pid", "fd", "size", "token", "num_pages")
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FD_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    medium: str
    pid: int
    fd: int
    size: int
    token: str
    num_pages: int
    def __init__(self, medium: _Optional[str] = ..., pid: _Optional[int] = ..., fd: _Optional[int] = ..., size: _Optional[int] = ..., token: _Optional[str] = ..., num_pages: _Optional[int] = ...) -> None: ...

class OpenSharedPoolsResponse(_message.Message):
    __slots__ = ("pools", "geometry", "boot_id", "pid_namespace")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    PID_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[SharedPool]
    geometry: _common_pb2.KVGeometry
    boot_id: str
    pid_namespace: int
    def __init__(self, pools: _Optional[_Iterable[_Union[SharedPool, _Mapping]]] = ..., geometry: _Optional[_Union[_common_pb2.KVGeometry, _Mapping]] = ..., boot_id: _Optional[str] = ..., pid_namespace: _Optional[int] = ...) -> None: ...

class MapBlocksRequest(_message.Message):
    __slots__ = ("block_hashes", "lease_ms", "prefix")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    lease_ms: int
    prefix: bool
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ..., lease_ms: _Optional[int] = ..., prefix: _Optional[bool] = ...) -> None: ...

class MapBlocksResponse(_message.Message):
    __slots__ = ("pages", "media", "lease_s", "pool_tokens")
    class PoolTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAGES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    POOL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    pages: _containers.RepeatedScalarFieldContainer[int]
    media: _containers.RepeatedScalarFieldContainer[str]
    lease_s: float
    pool_tokens: _containers.ScalarMap[str, str]
    def __init__(self, pages: _Optional[_Iterable[int]] = ..., media: _Optional[_Iterable[str]] = ..., lease_s: _Optional[float] = ..., pool_tokens: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NixlMetadataRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NixlPool(_message.Message):
    __slots__ = ("medium", "address", "size", "num_pages")
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    medium: str
    address: int
    size: int
    num_pages: int
    def __init__(self, medium: _Optional[str] = ..., address: _Optional[int] = ..., size: _Optional[int] = ..., num_pages: _Optional[int] = ...) -> None: ...

class NixlMetadataResponse(_message.Message):
    __slots__ = ("agent_name", "metadata", "pools", "geometry", "batch_notes")
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    BATCH_NOTES_FIELD_NUMBER: _ClassVar[int]
    agent_name: str
    metadata: bytes
    pools: _containers.RepeatedCompositeFieldContainer[NixlPool]
    geometry: _common_pb2.KVGeometry
    batch_notes: bool
    def __init__(self, agent_name: _Optional[str] = ..., metadata: _Optional[bytes] = ..., pools: _Optional[_Iterable[_Union[NixlPool, _Mapping]]] = ..., geometry: _Optional[_Union[_common_pb2.KVGeometry, _Mapping]] = ..., batch_notes: _Optional[bool] = ...) -> None: ...
