from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Arrival(_message.Message):
    __slots__ = ("time_s", "family", "node_id", "prompt_tokens", "cached_tokens")
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    time_s: float
    family: str
    node_id: str
    prompt_tokens: int
    cached_tokens: int
    def __init__(self, time_s: _Optional[float] = ..., family: _Optional[str] = ..., node_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class ObserveSummary(_message.Message):
    __slots__ = ("accepted", "rejected", "first_error")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    FIRST_ERROR_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected: int
    first_error: str
    def __init__(self, accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., first_error: _Optional[str] = ...) -> None: ...

class ForecastRequest(_message.Message):
    __slots__ = ("families", "horizons_s", "now_s", "max_families")
    FAMILIES_FIELD_NUMBER: _ClassVar[int]
    HORIZONS_S_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    MAX_FAMILIES_FIELD_NUMBER: _ClassVar[int]
    families: _containers.RepeatedScalarFieldContainer[str]
    horizons_s: _containers.RepeatedScalarFieldContainer[float]
    now_s: float
    max_families: int
    def __init__(self, families: _Optional[_Iterable[str]] = ..., horizons_s: _Optional[_Iterable[float]] = ..., now_s: _Optional[float] = ..., max_families: _Optional[int] = ...) -> None: ...

class HorizonForecast(_message.Message):
    __slots__ = ("horizon_s", "expected_count", "upper_quantile", "burst_probability")
    HORIZON_S_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    UPPER_QUANTILE_FIELD_NUMBER: _ClassVar[int]
    BURST_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    horizon_s: float
    expected_count: float
    upper_quantile: float
    burst_probability: float
    def __init__(self, horizon_s: _Optional[float] = ..., expected_count: _Optional[float] = ..., upper_quantile: _Optional[float] = ..., burst_probability: _Optional[float] = ...) -> None: ...

class FamilyForecast(_message.Message):
    __slots__ = ("family", "horizons", "known")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    HORIZONS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    family: str
    horizons: _containers.RepeatedCompositeFieldContainer[HorizonForecast]
    known: bool
    def __init__(self, family: _Optional[str] = ..., horizons: _Optional[_Iterable[_Union[HorizonForecast, _Mapping]]] = ..., known: _Optional[bool] = ...) -> None: ...

class ForecastResponse(_message.Message):
    __slots__ = ("forecasts", "model_version", "now_s")
    FORECASTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    forecasts: _containers.RepeatedCompositeFieldContainer[FamilyForecast]
    model_version: str
    now_s: float
    def __init__(self, forecasts: _Optional[_Iterable[_Union[FamilyForecast, _Mapping]]] = ..., model_version: _Optional[str] = ..., now_s: _Optional[float] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "version", "horizons_s", "quantile", "features", "metrics", "source", "loaded_at_s", "families_tracked", "observations_total", "burst_definition", "choices", "family_classes", "inference", "burst_choices", "served_models")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HORIZONS_S_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_S_FIELD_NUMBER: _ClassVar[int]
    FAMILIES_TRACKED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BURST_DEFINITION_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    FAMILY_CLASSES_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_FIELD_NUMBER: _ClassVar[int]
    BURST_CHOICES_FIELD_NUMBER: _ClassVar[int]
    SERVED_MODELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    horizons_s: _containers.RepeatedScalarFieldContainer[float]
    quantile: float
    features: _containers.RepeatedScalarFieldContainer[str]
    metrics: _containers.ScalarMap[str, float]
    source: str
    loaded_at_s: float
    families_tracked: int
    observations_total: int
    burst_definition: str
    choices: _containers.RepeatedCompositeFieldContainer[ForecastChoice]
    family_classes: str
    inference: str
    burst_choices: _containers.RepeatedCompositeFieldContainer[BurstChoice]
    served_models: _containers.RepeatedCompositeFieldContainer[ServedModel]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., horizons_s: _Optional[_Iterable[float]] = ..., quantile: _Optional[float] = ..., features: _Optional[_Iterable[str]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., source: _Optional[str] = ..., loaded_at_s: _Optional[float] = ..., families_tracked: _Optional[int] = ..., observations_total: _Optional[int] = ..., burst_definition: _Optional[str] = ..., choices: _Optional[_Iterable[_Union[ForecastChoice, _Mapping]]] = ..., family_classes: _Optional[str] = ..., inference: _Optional[str] = ..., burst_choices: _Optional[_Iterable[_Union[BurstChoice, _Mapping]]] = ..., served_models: _Optional[_Iterable[_Union[ServedModel, _Mapping]]] = ...) -> None: ...

class ServedModel(_message.Message):
    __slots__ = ("kind", "version", "origin", "window_start_s", "window_end_s", "fitted_at_s", "training_rows", "validation_metric", "validation_score", "replaced_score", "online_learning")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_S_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_S_FIELD_NUMBER: _ClassVar[int]
    FITTED_AT_S_FIELD_NUMBER: _ClassVar[int]
    TRAINING_ROWS_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_METRIC_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_SCORE_FIELD_NUMBER: _ClassVar[int]
    REPLACED_SCORE_FIELD_NUMBER: _ClassVar[int]
    ONLINE_LEARNING_FIELD_NUMBER: _ClassVar[int]
    kind: str
    version: str
    origin: str
    window_start_s: float
    window_end_s: float
    fitted_at_s: float
    training_rows: int
    validation_metric: str
    validation_score: float
    replaced_score: float
    online_learning: bool
    def __init__(self, kind: _Optional[str] = ..., version: _Optional[str] = ..., origin: _Optional[str] = ..., window_start_s: _Optional[float] = ..., window_end_s: _Optional[float] = ..., fitted_at_s: _Optional[float] = ..., training_rows: _Optional[int] = ..., validation_metric: _Optional[str] = ..., validation_score: _Optional[float] = ..., replaced_score: _Optional[float] = ..., online_learning: _Optional[bool] = ...) -> None: ...

class BurstChoice(_message.Message):
    __slots__ = ("horizon_s", "chosen", "alarm_threshold", "validation_bursts", "candidates")
    HORIZON_S_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    ALARM_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_BURSTS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    horizon_s: float
    chosen: str
    alarm_threshold: float
    validation_bursts: int
    candidates: _containers.RepeatedCompositeFieldContainer[BurstSourceScore]
    def __init__(self, horizon_s: _Optional[float] = ..., chosen: _Optional[str] = ..., alarm_threshold: _Optional[float] = ..., validation_bursts: _Optional[int] = ..., candidates: _Optional[_Iterable[_Union[BurstSourceScore, _Mapping]]] = ...) -> None: ...

class BurstSourceScore(_message.Message):
    __slots__ = ("source", "f1", "precision", "recall", "lead_s", "threshold")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    F1_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    RECALL_FIELD_NUMBER: _ClassVar[int]
    LEAD_S_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    source: str
    f1: float
    precision: float
    recall: float
    lead_s: float
    threshold: float
    def __init__(self, source: _Optional[str] = ..., f1: _Optional[float] = ..., precision: _Optional[float] = ..., recall: _Optional[float] = ..., lead_s: _Optional[float] = ..., threshold: _Optional[float] = ...) -> None: ...

class ForecastChoice(_message.Message):
    __slots__ = ("horizon_s", "family_class", "chosen", "weights", "candidates", "validation_rows", "inherited")
    HORIZON_S_FIELD_NUMBER: _ClassVar[int]
    FAMILY_CLASS_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_ROWS_FIELD_NUMBER: _ClassVar[int]
    INHERITED_FIELD_NUMBER: _ClassVar[int]
    horizon_s: float
    family_class: str
    chosen: str
    weights: _containers.RepeatedCompositeFieldContainer[CandidateWeight]
    candidates: _containers.RepeatedCompositeFieldContainer[CandidateScore]
    validation_rows: int
    inherited: bool
    def __init__(self, horizon_s: _Optional[float] = ..., family_class: _Optional[str] = ..., chosen: _Optional[str] = ..., weights: _Optional[_Iterable[_Union[CandidateWeight, _Mapping]]] = ..., candidates: _Optional[_Iterable[_Union[CandidateScore, _Mapping]]] = ..., validation_rows: _Optional[int] = ..., inherited: _Optional[bool] = ...) -> None: ...

class CandidateWeight(_message.Message):
    __slots__ = ("forecaster", "weight")
    FORECASTER_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    forecaster: str
    weight: float
    def __init__(self, forecaster: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class CandidateScore(_message.Message):
    __slots__ = ("forecaster", "validation_mae")
    FORECASTER_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_MAE_FIELD_NUMBER: _ClassVar[int]
    forecaster: str
    validation_mae: float
    def __init__(self, forecaster: _Optional[str] = ..., validation_mae: _Optional[float] = ...) -> None: ...

class ReloadModelRequest(_message.Message):
    __slots__ = ("path", "name")
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    path: str
    name: str
    def __init__(self, path: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class TurnEnd(_message.Message):
    __slots__ = ("conversation", "arrival_s", "end_s", "prompt_tokens", "output_tokens", "follow_ups")
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_UPS_FIELD_NUMBER: _ClassVar[int]
    conversation: str
    arrival_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int
    follow_ups: int
    def __init__(self, conversation: _Optional[str] = ..., arrival_s: _Optional[float] = ..., end_s: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., follow_ups: _Optional[int] = ...) -> None: ...

class TurnEndBatch(_message.Message):
    __slots__ = ("turn_ends",)
    TURN_ENDS_FIELD_NUMBER: _ClassVar[int]
    turn_ends: _containers.RepeatedCompositeFieldContainer[TurnEnd]
    def __init__(self, turn_ends: _Optional[_Iterable[_Union[TurnEnd, _Mapping]]] = ...) -> None: ...

class TurnEndAck(_message.Message):
    __slots__ = ("accepted", "opened", "open_conversations", "model")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    OPEN_CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    opened: int
    open_conversations: int
    model: str
    def __init__(self, accepted: _Optional[int] = ..., opened: _Optional[int] = ..., open_conversations: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class ForecastReturnsRequest(_message.Message):
    __slots__ = ("now_s", "within_s", "max_conversations", "min_probability")
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    WITHIN_S_FIELD_NUMBER: _ClassVar[int]
    MAX_CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    MIN_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    now_s: float
    within_s: float
    max_conversations: int
    min_probability: float
    def __init__(self, now_s: _Optional[float] = ..., within_s: _Optional[float] = ..., max_conversations: _Optional[int] = ..., min_probability: _Optional[float] = ...) -> None: ...

class ConversationReturn(_message.Message):
    __slots__ = ("conversation", "probability")
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    conversation: str
    probability: float
    def __init__(self, conversation: _Optional[str] = ..., probability: _Optional[float] = ...) -> None: ...

class ForecastReturnsResponse(_message.Message):
    __slots__ = ("returns", "model", "now_s", "open_conversations")
    RETURNS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    OPEN_CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    returns: _containers.RepeatedCompositeFieldContainer[ConversationReturn]
    model: str
    now_s: float
    open_conversations: int
    def __init__(self, returns: _Optional[_Iterable[_Union[ConversationReturn, _Mapping]]] = ..., model: _Optional[str] = ..., now_s: _Optional[float] = ..., open_conversations: _Optional[int] = ...) -> None: ...
