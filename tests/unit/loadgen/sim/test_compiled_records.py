"""The compiled build's explicit __init__ methods (record_inits.py) do exactly
what the dataclass-generated ones do: the same parameters in the same order
with the same defaults, every field set, __post_init__ called, frozen records
still frozen; and classes the rule cannot reproduce are left alone."""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import sys
import textwrap
import types
from typing import Iterator

import pytest

from speckv.loadgen.sim.compiled import HOT_MODULES
from speckv.loadgen.sim.record_inits import add_record_inits
from tests.support.repo import REPO_ROOT

# The records a simulation builds per request, per engine step or by the
# hundred per scheduler tick: each must get a compiled __init__.
PER_EVENT_RECORDS = {
    "loadgen/engines/emulated.py": {"EngineJob", "EngineEvent", "EngineLoad", "_Step", "StepCost", "JobTimes"},
    "loadgen/sim/event_loop.py": {"EventHandle"},
    "loadgen/sim/kvnode.py": {"PutOutcome"},
    "loadgen/sim/simulation.py": {"_Flight"},
    "services/common/traces/records.py": {"TraceRequest"},
    "services/predictor/serving/observations.py": {"Arrival", "ObserveResult"},
    "services/scheduler/cluster.py": {"NodeLoad"},
    "services/scheduler/families.py": {"FamilyProfile"},
    "services/scheduler/forecasts.py": {"Forecast"},
    "services/scheduler/holder_index.py": {"IndexEvent"},
    "services/scheduler/views.py": {"NodeView"},
    "services/scheduler/routing/route_records.py": {"RouteResult", "PickedRoute"},
    "services/scheduler/routing/router.py": {"Candidate", "RouteDecision", "RouteQuery"},
}


def module_name(path: str) -> str:
    top, *rest = path.removesuffix(".py").split("/")
    return ".".join(["speckv", top, *rest])


@contextlib.contextmanager
def transformed(source: str, name: str = "record_inits_case") -> Iterator[tuple[types.ModuleType, list[str]]]:
    """The transformed source executed as a module (registered while in use:
    dataclasses reads its namespace to resolve string annotations)."""
    text, generated = add_record_inits(source)
    module = types.ModuleType(f"_speckv_test_{name.replace('.', '_')}")
    sys.modules[module.__name__] = module
    try:
        exec(compile(text, module.__name__, "exec"), module.__dict__)
        yield module, generated
    finally:
        del sys.modules[module.__name__]


def signature_of(cls: type) -> list[tuple[str, str, object]]:
    """(name, repr of the default, kind) per parameter: by repr, since an enum
    default of the executed copy is not the original module's member."""
    return [(p.name, repr(p.default), p.kind) for p in list(inspect.signature(cls.__init__).parameters.values())[1:]]


@pytest.mark.parametrize("path", HOT_MODULES)
def test_every_generated_init_matches_the_dataclass_one(path):
    original = importlib.import_module(module_name(path))
    with transformed((REPO_ROOT / path).read_text(), path) as (module, generated):
        for name in generated:
            mine, theirs = getattr(module, name), getattr(original, name)
            assert "__init__" in vars(mine) and signature_of(mine) == signature_of(theirs), name
            assert dataclasses.fields(mine) and [f.name for f in dataclasses.fields(mine)] == \
                   [f.name for f in dataclasses.fields(theirs)], name
            if hasattr(mine, "__post_init__"):
                continue  # validates its arguments: the synthetic cases below cover the call
            fields = [f for f in dataclasses.fields(mine) if f.init]
            values = {f.name: object() for f in fields}  # distinct sentinels: a swapped or missed field shows
            made = mine(**values)
            assert {f.name: getattr(made, f.name) for f in fields} == values, name


@pytest.mark.parametrize("path, names", sorted(PER_EVENT_RECORDS.items()))
def test_the_per_event_records_get_a_compiled_init(path, names):
    _, generated = add_record_inits((REPO_ROOT / path).read_text())
    assert names <= set(generated)


def test_the_source_records_are_plain_dataclasses():
    """Their __init__ is the one dataclasses generates, not one written in the source."""
    for path, names in PER_EVENT_RECORDS.items():
        module = importlib.import_module(module_name(path))
        for name in names:
            assert getattr(module, name).__init__.__code__.co_filename != module.__file__, name


CASES = textwrap.dedent('''
    from __future__ import annotations

    import dataclasses
    from dataclasses import dataclass, field
    from typing import ClassVar

    @dataclass(slots=True)
    class Plain:
        a: int
        b: str = "x"
        c: float = field(default=2.5)
        hidden: int = field(default=0, init=False)
        limit: ClassVar[int] = 3

    @dataclass(frozen=True, slots=True)
    class Frozen:
        a: int
        b: tuple[int, ...] = ()

    @dataclasses.dataclass(slots=True)
    class Checked:
        a: int
        seen: list = field(default=None, init=False)

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("a < 0")
            self.seen = [self.a]

    @dataclass
    class Factory:
        a: list = field(default_factory=list)

    @dataclass(kw_only=True)
    class KwOnly:
        a: int

    @dataclass(init=False)
    class NoInit:
        a: int = 1

    @dataclass
    class Own:
        a: int

        def __init__(self, a: int) -> None:
            self.a = a * 2

    @dataclass
    class Child(Plain):
        d: int = 0
''')


def test_the_rule_on_each_kind_of_dataclass():
    with transformed(CASES) as (m, generated):
        assert generated == ["Plain", "Frozen", "Checked"]
        assert [name for name, _, _ in signature_of(m.Plain)] == ["a", "b", "c"]
        made = m.Plain(1)
        assert (made.a, made.b, made.c, made.hidden) == (1, "x", 2.5, 0)
        frozen = m.Frozen(1, (2,))
        with pytest.raises(dataclasses.FrozenInstanceError):
            frozen.a = 5
        assert frozen == m.Frozen(1, (2,)) and hash(frozen) == hash(m.Frozen(1, (2,)))
        assert m.Checked(4).seen == [4]
        with pytest.raises(ValueError):
            m.Checked(-1)
        assert m.Own(2).a == 4  # a class's own __init__ stays
        assert repr(made) == "Plain(a=1, b='x', c=2.5, hidden=0)" and dataclasses.replace(made, a=3).a == 3


def test_a_module_that_evaluates_its_annotations_is_left_alone():
    source = CASES.replace("from __future__ import annotations\n", "")
    assert add_record_inits(source) == (source, [])
