from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class OrderState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ORDER_STATE_UNSPECIFIED: _ClassVar[OrderState]
    ORDER_STATE_ISSUED: _ClassVar[OrderState]
    ORDER_STATE_IN_FLIGHT: _ClassVar[OrderState]
    ORDER_STATE_COMMITTED: _ClassVar[OrderState]
    ORDER_STATE_FAILED: _ClassVar[OrderState]
    ORDER_STATE_CANCELLED: _ClassVar[OrderState]
    ORDER_STATE_EXPIRED: _ClassVar[OrderState]
ORDER_STATE_UNSPECIFIED: OrderState
ORDER_STATE_ISSUED: OrderState
ORDER_STATE_IN_FLIGHT: OrderState
ORDER_STATE_COMMITTED: OrderState
ORDER_STATE_FAILED: OrderState
ORDER_STATE_CANCELLED: OrderState
ORDER_STATE_EXPIRED: OrderState

class KVGeometry(_message.Message):
    __slots__ = ("num_layers", "num_kv_heads", "head_dim", "dtype", "block_size", "bytes_per_block", "name")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int
    bytes_per_block: int
    name: str
    def __init__(self, num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[str] = ..., block_size: _Optional[int] = ..., bytes_per_block: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class ReplicationOrder(_message.Message):
    __slots__ = ("order_id", "family", "block_hashes", "source_node", "target_node", "target_address", "lease_ms", "priority", "expected_benefit_ms", "policy", "cancelled", "target_medium", "action", "epoch")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NODE_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_BENEFIT_MS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    TARGET_MEDIUM_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    family: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    source_node: str
    target_node: str
    target_address: str
    lease_ms: int
    priority: int
    expected_benefit_ms: float
    policy: str
    cancelled: bool
    target_medium: str
    action: str
    epoch: int
    def __init__(self, order_id: _Optional[str] = ..., family: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., source_node: _Optional[str] = ..., target_node: _Optional[str] = ..., target_address: _Optional[str] = ..., lease_ms: _Optional[int] = ..., priority: _Optional[int] = ..., expected_benefit_ms: _Optional[float] = ..., policy: _Optional[str] = ..., cancelled: _Optional[bool] = ..., target_medium: _Optional[str] = ..., action: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...
