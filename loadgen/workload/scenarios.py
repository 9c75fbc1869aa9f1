"""Named synthetic workloads: services/config/scenarios.json, or a user's
own file of the same shape (`speckv simulate --scenarios PATH`).

A scenario is one generator (synthetic.py's mmpp or hawkes, fanout.py's
fanout) with its parameters and family shape; keys left out take the
dataclasses' defaults, a JSON list becomes a tuple (a (lo, hi) range),
block tokens always come from the e2e configuration (the trace's block and
the engine's must agree), and the seed from the command line. A bad file
(unknown generator or key, a value the generator refuses) is an
InvalidArgument naming the scenario and the key, before anything runs.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from speckv.loadgen.workload.fanout import FanoutParams, fanout
from speckv.loadgen.workload.fanout import describe as describe_fanout
from speckv.loadgen.workload.synthetic import FamilyShape, HawkesParams, MmppParams, describe, hawkes, mmpp
from speckv.services.common.config import CONFIG_DIR
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.traces import TraceRequest

DEFAULT_SCENARIOS_PATH = CONFIG_DIR / "scenarios.json"
GENERATORS = {"mmpp": MmppParams, "hawkes": HawkesParams, "fanout": FanoutParams}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    generator: str  # a key of GENERATORS
    params: MmppParams | HawkesParams | FanoutParams
    shape: FamilyShape
    note: str

    def requests(self) -> list[TraceRequest]:
        """The workload, in arrival order (one seed, one workload)."""
        if isinstance(self.params, MmppParams):
            return mmpp(self.params, self.shape)
        if isinstance(self.params, FanoutParams):
            return fanout(self.params, self.shape)
        return hawkes(self.params, self.shape)

    def describe(self) -> dict[str, object]:
        """What the report prints: every parameter, defaults included."""
        if isinstance(self.params, FanoutParams):
            described = describe_fanout(self.params, self.shape)
        else:
            described = describe(self.params, self.shape)
        return {"scenario": self.name, **described, "note": self.note}


def load_scenarios(path: Path | str | None = None) -> dict[str, Mapping]:
    """The raw scenario table of the file (name -> its JSON object)."""
    source = Path(path) if path else DEFAULT_SCENARIOS_PATH
    try:
        table = json.loads(source.read_text())["scenarios"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(f"scenarios file {source}: unreadable or no 'scenarios' object ({exc})") from None
    if not isinstance(table, dict) or not table:
        raise InvalidArgument(f"scenarios file {source}: 'scenarios' must name at least one scenario")
    return table


def get_scenario(name: str, seed: int, block_tokens: int, path: Path | str | None = None) -> Scenario:
    table = load_scenarios(path)
    if name not in table:
        raise InvalidArgument(f"--synthetic={name!r}: no such scenario; expected one of {', '.join(sorted(table))}")
    raw = table[name]
    generator = raw.get("generator") if isinstance(raw, dict) else None
    if generator not in GENERATORS:
        raise InvalidArgument(f"scenario {name!r}: generator must be one of {', '.join(GENERATORS)}, "
                              f"not {generator!r}")
    params_raw = {key: tuple(value) if isinstance(value, list) else value
                  for key, value in dict(raw.get("params", {})).items()}
    params = _build(name, "params", GENERATORS[generator], {**params_raw, "seed": seed})
    shape_raw = dict(raw.get("shape", {}))
    if "output_tokens" in shape_raw:
        shape_raw["output_tokens"] = tuple(shape_raw["output_tokens"])
    shape = _build(name, "shape", FamilyShape, {**shape_raw, "block_tokens": block_tokens})
    return Scenario(name, generator, params, shape, str(raw.get("note", "")))


def _build(name: str, section: str, cls: type, values: Mapping[str, object]):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise InvalidArgument(f"scenario {name!r}: unknown {section} key(s) {', '.join(unknown)}; "
                              f"{cls.__name__} takes {', '.join(sorted(known))}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"scenario {name!r} {section}: {exc}") from None


def seed_sets(path: Path | str | None = None) -> dict[str, list[int]]:
    """The named seed sets of the file's "seeds" object (name -> seeds in
    order; "about" is its prose); a file without one has none."""
    source = Path(path) if path else DEFAULT_SCENARIOS_PATH
    try:
        raw = json.loads(source.read_text()).get("seeds", {})
    except (OSError, ValueError, AttributeError) as exc:
        raise InvalidArgument(f"scenarios file {source}: unreadable ({exc})") from None
    if not isinstance(raw, dict):
        raise InvalidArgument(f"scenarios file {source}: 'seeds' must be an object of named lists")
    sets: dict[str, list[int]] = {}
    for name, seeds in raw.items():
        if name == "about":
            continue
        if not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds) \
                or len(set(seeds)) != len(seeds):
            raise InvalidArgument(f"scenarios file {source}: seed set {name!r} must list distinct integers")
        sets[name] = list(seeds)
    return sets


def parse_seeds(text: str, path: Path | str | None = None) -> list[int]:
    """`--seeds`: comma-separated integers, each once, or the name of a seed
    set (seed_sets) of the scenarios file at `path`, else of the committed one."""
    if "," not in text and text.strip() and not text.strip().lstrip("-").isdigit():
        sets = seed_sets(path) or (seed_sets() if path else {})
        if text.strip() not in sets:
            raise InvalidArgument(f"--seeds={text!r}: no such seed set; expected one of "
                                  f"{', '.join(sorted(sets)) or '(none in the file)'} or integers, e.g. 11,13,17")
        return sets[text.strip()]
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidArgument(f"--seeds={text!r}: expected integers, e.g. 11,13,17, or a seed set's name") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise InvalidArgument(f"--seeds={text!r}: name each seed once")
    return seeds
