from speckv.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Leadership(_message.Message):
    __slots__ = ("epoch", "leader_id", "leader_address", "answering_is_leader")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ANSWERING_IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    leader_id: str
    leader_address: str
    answering_is_leader: bool
    def __init__(self, epoch: _Optional[int] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., answering_is_leader: _Optional[bool] = ...) -> None: ...

class RouteObservation(_message.Message):
    __slots__ = ("family", "block_hashes", "prompt_tokens", "node_id", "cached_blocks", "fetch_blocks", "fetch_from", "pull_holder", "prefill_ms", "uncached_tokens", "arrival_time_s", "disk_blocks", "enters_in_ms")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FETCH_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FETCH_FROM_FIELD_NUMBER: _ClassVar[int]
    PULL_HOLDER_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    UNCACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_S_FIELD_NUMBER: _ClassVar[int]
    DISK_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ENTERS_IN_MS_FIELD_NUMBER: _ClassVar[int]
    family: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    prompt_tokens: int
    node_id: str
    cached_blocks: int
    fetch_blocks: int
    fetch_from: str
    pull_holder: str
    prefill_ms: float
    uncached_tokens: int
    arrival_time_s: float
    disk_blocks: int
    enters_in_ms: float
    def __init__(self, family: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., prompt_tokens: _Optional[int] = ..., node_id: _Optional[str] = ..., cached_blocks: _Optional[int] = ..., fetch_blocks: _Optional[int] = ..., fetch_from: _Optional[str] = ..., pull_holder: _Optional[str] = ..., prefill_ms: _Optional[float] = ..., uncached_tokens: _Optional[int] = ..., arrival_time_s: _Optional[float] = ..., disk_blocks: _Optional[int] = ..., enters_in_ms: _Optional[float] = ...) -> None: ...

class RouteObservations(_message.Message):
    __slots__ = ("replica_id", "routes")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    routes: _containers.RepeatedCompositeFieldContainer[RouteObservation]
    def __init__(self, replica_id: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[RouteObservation, _Mapping]]] = ...) -> None: ...

class ShareRoutesAck(_message.Message):
    __slots__ = ("applied",)
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: int
    def __init__(self, applied: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "address", "capacity_pages", "geometry", "host_pages", "retain_max_blocks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_PAGES_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    HOST_PAGES_FIELD_NUMBER: _ClassVar[int]
    RETAIN_MAX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    capacity_pages: int
    geometry: _common_pb2.KVGeometry
    host_pages: int
    retain_max_blocks: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., capacity_pages: _Optional[int] = ..., geometry: _Optional[_Union[_common_pb2.KVGeometry, _Mapping]] = ..., host_pages: _Optional[int] = ..., retain_max_blocks: _Optional[int] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("node_id", "heartbeat_interval_ms", "re_registered", "leadership")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    RE_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    LEADERSHIP_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    heartbeat_interval_ms: int
    re_registered: bool
    leadership: Leadership
    def __init__(self, node_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., re_registered: _Optional[bool] = ..., leadership: _Optional[_Union[Leadership, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "queued_tokens", "running_tokens", "free_pages", "num_running_requests", "num_waiting_requests", "queued_prefill_ms", "retained_blocks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    RETAINED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    queued_tokens: int
    running_tokens: int
    free_pages: int
    num_running_requests: int
    num_waiting_requests: int
    queued_prefill_ms: float
    retained_blocks: int
    def __init__(self, node_id: _Optional[str] = ..., queued_tokens: _Optional[int] = ..., running_tokens: _Optional[int] = ..., free_pages: _Optional[int] = ..., num_running_requests: _Optional[int] = ..., num_waiting_requests: _Optional[int] = ..., queued_prefill_ms: _Optional[float] = ..., retained_blocks: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known", "leadership")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    LEADERSHIP_FIELD_NUMBER: _ClassVar[int]
    known: bool
    leadership: Leadership
    def __init__(self, known: _Optional[bool] = ..., leadership: _Optional[_Union[Leadership, _Mapping]] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("request_id", "block_hashes", "prompt_tokens", "family", "arrival_time_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    prompt_tokens: int
    family: str
    arrival_time_s: float
    def __init__(self, request_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., prompt_tokens: _Optional[int] = ..., family: _Optional[str] = ..., arrival_time_s: _Optional[float] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("node_id", "address", "cached_blocks", "expected_ttft_ms", "fetch_from_node", "fetch_blocks", "family", "queue_ms", "prefill_ms", "fetch_ms", "promote_blocks", "promote_ms", "disk_blocks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    FETCH_FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    FETCH_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    FETCH_MS_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_MS_FIELD_NUMBER: _ClassVar[int]
    DISK_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    cached_blocks: int
    expected_ttft_ms: float
    fetch_from_node: str
    fetch_blocks: int
    family: str
    queue_ms: float
    prefill_ms: float
    fetch_ms: float
    promote_blocks: int
    promote_ms: float
    disk_blocks: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., cached_blocks: _Optional[int] = ..., expected_ttft_ms: _Optional[float] = ..., fetch_from_node: _Optional[str] = ..., fetch_blocks: _Optional[int] = ..., family: _Optional[str] = ..., queue_ms: _Optional[float] = ..., prefill_ms: _Optional[float] = ..., fetch_ms: _Optional[float] = ..., promote_blocks: _Optional[int] = ..., promote_ms: _Optional[float] = ..., disk_blocks: _Optional[int] = ...) -> None: ...

class RouteBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RouteRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[RouteRequest, _Mapping]]] = ...) -> None: ...

class RouteBatchResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[RouteResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[RouteResponse, _Mapping]]] = ...) -> None: ...

class WatchOrdersRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class SubmitOrderRequest(_message.Message):
    __slots__ = ("order",)
    ORDER_FIELD_NUMBER: _ClassVar[int]
    order: _common_pb2.ReplicationOrder
    def __init__(self, order: _Optional[_Union[_common_pb2.ReplicationOrder, _Mapping]] = ...) -> None: ...

class SubmitOrderResponse(_message.Message):
    __slots__ = ("order_id",)
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    def __init__(self, order_id: _Optional[str] = ...) -> None: ...

class OrderStatusReport(_message.Message):
    __slots__ = ("order_id", "state", "message", "bytes_sent", "blocks_sent", "transport")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_SENT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    state: _common_pb2.OrderState
    message: str
    bytes_sent: int
    blocks_sent: int
    transport: str
    def __init__(self, order_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.OrderState, str]] = ..., message: _Optional[str] = ..., bytes_sent: _Optional[int] = ..., blocks_sent: _Optional[int] = ..., transport: _Optional[str] = ...) -> None: ...

class OrderStatusAck(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.OrderState
    def __init__(self, state: _Optional[_Union[_common_pb2.OrderState, str]] = ...) -> None: ...

class SetPolicyRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PolicyInfo(_message.Message):
    __slots__ = ("name", "available", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    available: _containers.RepeatedScalarFieldContainer[str]
    description: str
    def __init__(self, name: _Optional[str] = ..., available: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ...) -> None: ...

class ClusterStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeState(_message.Message):
    __slots__ = ("node_id", "address", "alive", "capacity_pages", "free_pages", "queued_tokens", "running_tokens", "num_blocks", "last_heartbeat_age_s", "routes_total", "host_pages", "host_blocks", "retain_max_blocks", "retained_blocks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_PAGES_FIELD_NUMBER: _ClassVar[int]
    FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    ROUTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HOST_PAGES_FIELD_NUMBER: _ClassVar[int]
    HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RETAIN_MAX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RETAINED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    alive: bool
    capacity_pages: int
    free_pages: int
    queued_tokens: int
    running_tokens: int
    num_blocks: int
    last_heartbeat_age_s: float
    routes_total: int
    host_pages: int
    host_blocks: int
    retain_max_blocks: int
    retained_blocks: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., alive: _Optional[bool] = ..., capacity_pages: _Optional[int] = ..., free_pages: _Optional[int] = ..., queued_tokens: _Optional[int] = ..., running_tokens: _Optional[int] = ..., num_blocks: _Optional[int] = ..., last_heartbeat_age_s: _Optional[float] = ..., routes_total: _Optional[int] = ..., host_pages: _Optional[int] = ..., host_blocks: _Optional[int] = ..., retain_max_blocks: _Optional[int] = ..., retained_blocks: _Optional[int] = ...) -> None: ...

class OrderCount(_message.Message):
    __slots__ = ("state", "count")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.OrderState
    count: int
    def __init__(self, state: _Optional[_Union[_common_pb2.OrderState, str]] = ..., count: _Optional[int] = ...) -> None: ...

class ClusterState(_message.Message):
    __slots__ = ("nodes", "policy", "orders", "num_families", "now_s", "replicas_committed", "replicas_kept", "replicas_released_unused", "bytes_replicated", "bytes_wasted", "order_retries", "actions", "transports", "leadership")
    NODES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    NUM_FAMILIES_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_KEPT_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_RELEASED_UNUSED_FIELD_NUMBER: _ClassVar[int]
    BYTES_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    BYTES_WASTED_FIELD_NUMBER: _ClassVar[int]
    ORDER_RETRIES_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    LEADERSHIP_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeState]
    policy: str
    orders: _containers.RepeatedCompositeFieldContainer[OrderCount]
    num_families: int
    now_s: float
    replicas_committed: int
    replicas_kept: int
    replicas_released_unused: int
    bytes_replicated: int
    bytes_wasted: int
    order_retries: int
    actions: _containers.RepeatedCompositeFieldContainer[ActionOutcomeStats]
    transports: _containers.RepeatedCompositeFieldContainer[TransportStats]
    leadership: Leadership
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeState, _Mapping]]] = ..., policy: _Optional[str] = ..., orders: _Optional[_Iterable[_Union[OrderCount, _Mapping]]] = ..., num_families: _Optional[int] = ..., now_s: _Optional[float] = ..., replicas_committed: _Optional[int] = ..., replicas_kept: _Optional[int] = ..., replicas_released_unused: _Optional[int] = ..., bytes_replicated: _Optional[int] = ..., bytes_wasted: _Optional[int] = ..., order_retries: _Optional[int] = ..., actions: _Optional[_Iterable[_Union[ActionOutcomeStats, _Mapping]]] = ..., transports: _Optional[_Iterable[_Union[TransportStats, _Mapping]]] = ..., leadership: _Optional[_Union[Leadership, _Mapping]] = ...) -> None: ...

class TransportStats(_message.Message):
    __slots__ = ("source_node", "target_node", "transport", "orders", "bytes")
    SOURCE_NODE_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    source_node: str
    target_node: str
    transport: str
    orders: int
    bytes: int
    def __init__(self, source_node: _Optional[str] = ..., target_node: _Optional[str] = ..., transport: _Optional[str] = ..., orders: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ActionOutcomeStats(_message.Message):
    __slots__ = ("policy", "action", "forecast", "orders", "bytes", "expected_ms", "outcomes", "bytes_by_outcome", "expected_ms_by_outcome", "read_after_lease", "bytes_read_after_lease", "by_forecast")
    class OutcomesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class BytesByOutcomeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ExpectedMsByOutcomeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    BYTES_BY_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_MS_BY_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    READ_AFTER_LEASE_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_AFTER_LEASE_FIELD_NUMBER: _ClassVar[int]
    BY_FORECAST_FIELD_NUMBER: _ClassVar[int]
    policy: str
    action: str
    forecast: str
    orders: int
    bytes: int
    expected_ms: float
    outcomes: _containers.ScalarMap[str, int]
    bytes_by_outcome: _containers.ScalarMap[str, int]
    expected_ms_by_outcome: _containers.ScalarMap[str, float]
    read_after_lease: int
    bytes_read_after_lease: int
    by_forecast: _containers.RepeatedCompositeFieldContainer[ActionOutcomeStats]
    def __init__(self, policy: _Optional[str] = ..., action: _Optional[str] = ..., forecast: _Optional[str] = ..., orders: _Optional[int] = ..., bytes: _Optional[int] = ..., expected_ms: _Optional[float] = ..., outcomes: _Optional[_Mapping[str, int]] = ..., bytes_by_outcome: _Optional[_Mapping[str, int]] = ..., expected_ms_by_outcome: _Optional[_Mapping[str, float]] = ..., read_after_lease: _Optional[int] = ..., bytes_read_after_lease: _Optional[int] = ..., by_forecast: _Optional[_Iterable[_Union[ActionOutcomeStats, _Mapping]]] = ...) -> None: ...
