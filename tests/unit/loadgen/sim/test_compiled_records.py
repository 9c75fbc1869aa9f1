"""The records whose __init__ is written out (so mypyc compiles it) take
exactly their dataclass fields: the same names, order and defaults as the
generated __init__ would, and they set every field."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from speckv.loadgen.engines.emulated import (
    EngineEvent,
    EngineEventKind,
    EngineJob,
    EngineLoad,
    JobTimes,
    StepCost,
    _Step,
)
from speckv.loadgen.sim.event_loop import EventHandle
from speckv.loadgen.sim.kvnode import PutOutcome
from speckv.loadgen.sim.simulation import _Flight
from speckv.services.common.traces.records import TraceRequest
from speckv.services.predictor.observations import Arrival, ObserveResult
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.families import FamilyProfile
from speckv.services.scheduler.forecasts import Forecast
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.policies.base import NodeView
from speckv.services.scheduler.routing.route_records import PickedRoute, RouteResult
from speckv.services.scheduler.routing.router import Candidate, RouteDecision, RouteQuery

RECORDS = [EngineJob, EngineEvent, EngineLoad, _Step, StepCost, JobTimes, NodeLoad, EventHandle, IndexEvent, Candidate,
           RouteDecision, RouteQuery, RouteResult, PickedRoute, Arrival, Forecast, TraceRequest, NodeView, FamilyProfile,
           PutOutcome, _Flight, ObserveResult]
FROZEN = [Forecast, TraceRequest, NodeView]


def _expected(field: dataclasses.Field) -> object:
    assert field.default_factory is dataclasses.MISSING, "write a default_factory out by hand, then test it"
    return inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_the_written_init_takes_the_fields_in_order_with_their_defaults(record):
    params = list(inspect.signature(record.__init__).parameters.values())[1:]
    fields = dataclasses.fields(record)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [_expected(f) for f in fields]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_the_written_init_sets_every_field_to_its_argument(record):
    fields = dataclasses.fields(record)
    values = {f.name: object() for f in fields}  # distinct sentinels: a swapped or missed field shows
    made = record(**values)
    assert {f.name: getattr(made, f.name) for f in fields} == values


def test_the_records_stay_dataclasses_with_repr_and_replace():
    job = EngineJob("r1", 100, 5)
    assert repr(job).startswith("EngineJob(request_id='r1', prompt_tokens=100")
    assert dataclasses.replace(job, cached_tokens=64).cached_tokens == 64
    event = IndexEvent(HolderEventKind.STORED, [1, 2])
    assert event == IndexEvent(HolderEventKind.STORED, [1, 2]) and event.family == "" and event.sequence == 0
    assert EngineEvent(EngineEventKind.FINISHED, job, 1.0).job is job


@pytest.mark.parametrize("record", FROZEN, ids=lambda r: r.__name__)
def test_a_frozen_record_stays_frozen_and_hashable(record):
    fields = dataclasses.fields(record)
    values = {f.name: f"v{i}" for i, f in enumerate(fields)}
    made = record(**values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, fields[0].name, "other")
    assert made == record(**values) and hash(made) == hash(record(**values))
    assert made != record(**{**values, fields[-1].name: "other"})


def test_a_job_equals_only_itself():
    a, b = EngineJob("r1", 100, 5), EngineJob("r1", 100, 5)
    assert a == a and a != b and [a, b].index(b) == 1
