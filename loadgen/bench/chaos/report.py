"""What `speckv bench chaos` records: each case's expected and observed
outcome, grouped by area, plus measured figures (reported against their
targets, never part of a case's verdict: the machine is shared, so a timing
is a figure, not a behaviour)."""
from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import grpc

# Codes that mean a service failed rather than refused: a chaos case that
# sees one of them is wrong whatever else it expected.
SERVER_FAULTS = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
# Every server fault any call of the run ended with (code_of appends), so the
# run's "0 INTERNAL" figure counts background traffic too, not only verdicts.
FAULTS_SEEN: list[str] = []


@dataclass(slots=True)
class Verdict:
    """What a case saw: ok is whether it behaved as expected."""

    ok: bool
    observed: str


@dataclass(slots=True)
class CaseResult:
    name: str
    expected: str
    observed: str
    correct: bool
    seconds: float


@dataclass(slots=True)
class Figure:
    """A measurement with its target (reported, not judged)."""

    name: str
    value: float
    unit: str
    target: str = ""
    met: bool | None = None


@dataclass(slots=True)
class AreaResult:
    name: str
    cases: list[CaseResult] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)

    @property
    def tried(self) -> int:
        return len(self.cases)

    @property
    def correct(self) -> int:
        return sum(c.correct for c in self.cases)

    def to_json(self) -> dict[str, object]:
        return {"area": self.name, "tried": self.tried, "correct": self.correct,
                "cases": [asdict(c) for c in self.cases], "figures": [asdict(f) for f in self.figures]}


class Recorder:
    """Runs cases one at a time, each bounded by the caller's own deadlines;
    a case that raises is recorded as incorrect with what it raised (the
    suite goes on: one broken case must not hide the others)."""

    def __init__(self, verbose: bool = True) -> None:
        self.areas: dict[str, AreaResult] = {}
        self._verbose = verbose

    def area(self, name: str) -> AreaResult:
        return self.areas.setdefault(name, AreaResult(name))

    def case(self, area: str, name: str, expected: str, run: Callable[[], Verdict]) -> CaseResult:
        start = time.monotonic()
        try:
            verdict = run()
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            if code in SERVER_FAULTS:
                FAULTS_SEEN.append(f"{area}/{name}: {code.name}")
            verdict = Verdict(False, f"unexpected {getattr(code, 'name', code)}: {_details(exc)}")
        except Exception as exc:  # noqa: BLE001 - a case's own failure is a result, not the suite's end
            verdict = Verdict(False, f"the case raised {type(exc).__name__}: {exc}; "
                                     f"{traceback.format_exc(limit=3).splitlines()[-2].strip()}")
        result = CaseResult(name, expected, verdict.observed, verdict.ok, round(time.monotonic() - start, 3))
        self.area(area).cases.append(result)
        if self._verbose:
            print(f"  [{'ok' if result.correct else 'WRONG'}] {area}/{name}: {result.observed}", flush=True)
        return result

    def figure(self, area: str, figure: Figure) -> None:
        self.area(area).figures.append(figure)
        if self._verbose:
            print(f"  figure {area}/{figure.name}: {figure.value:.4g} {figure.unit} {figure.target}", flush=True)

    def summary_lines(self) -> list[str]:
        lines = [f"{'area':<12} {'tried':>5} {'correct':>7}"]
        for area in self.areas.values():
            lines.append(f"{area.name:<12} {area.tried:>5} {area.correct:>7}")
        tried = sum(a.tried for a in self.areas.values())
        correct = sum(a.correct for a in self.areas.values())
        lines.append(f"{'all':<12} {tried:>5} {correct:>7}")
        return lines

    def write_json(self, path: Path, meta: dict[str, object]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**meta, "areas": [a.to_json() for a in self.areas.values()]}, indent=2))


def _details(exc: grpc.RpcError) -> str:
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    return (details or "")[:200]


def code_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status a call ends with (OK when it returns) and its details."""
    try:
        result = call()
        if hasattr(result, "__next__"):  # a response stream: drain it so its status is final
            for _ in result:
                pass
    except grpc.RpcError as exc:
        if exc.code() in SERVER_FAULTS:
            FAULTS_SEEN.append(f"{exc.code().name}: {_details(exc)}")
        return exc.code(), _details(exc)
    return grpc.StatusCode.OK, ""


def expect_code(call: Callable[[], object], *wanted: grpc.StatusCode,
                also: Callable[[], tuple[bool, str]] | None = None) -> Verdict:
    """A verdict: the call ends with one of wanted, and also() (a check of
    what must not have changed) holds."""
    code, details = code_of(call)
    observed = f"{code.name}" + (f" ({details[:120]})" if details else "")
    ok = code in wanted
    if also is not None:
        held, what = also()
        ok = ok and held
        observed += f"; {what}"
    return Verdict(ok, observed)
