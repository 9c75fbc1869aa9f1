"""FastEngine jumps decode stretches; its events equal EmulatedEngine's step by step."""
from __future__ import annotations

import random

import pytest

from speckv.loadgen.engines.emulated import EmulatedEngine, EngineJob, EngineLimits
from speckv.loadgen.engines.fast import FastEngine
from speckv.services.common.engine_profile import LinkModel, get_profile

PROFILE = get_profile("llama-3-8b-h100")
LINK = LinkModel(25.0, 1.0)


def drive(engine, arrivals, probes):
    """Submits arrivals (t, job args) and advances at probe times, then to idle."""
    events = []
    timeline = sorted([(t, 0, a) for t, a in arrivals] + [(t, 1, None) for t in probes], key=lambda x: (x[0], x[1]))
    for t, kind, args in timeline:
        events += engine.advance(t)
        if kind == 0:
            engine.submit(EngineJob(*args), t)
    while (t := engine.next_event_s()) is not None:
        events += engine.advance(t)
    return [(ev.kind, ev.job.request_id, ev.time_s) for ev in events], engine.steps


@pytest.mark.parametrize("seed,max_seqs", [(1, 256), (2, 256), (3, 4)])
def test_fast_engine_matches_step_by_step(seed, max_seqs):
    rng = random.Random(seed)
    limits = EngineLimits(8192, max_seqs, 4.8, 3350.0, 1.0)
    arrivals = [(rng.uniform(0, 30), (f"r{i}", rng.randint(50, 20000), rng.randint(1, 600),
                                      rng.choice([0, 0, 512, 4096])))
                for i in range(60)]
    arrivals = [(t, (rid, p, o, min(c, p - 1))) for t, (rid, p, o, c) in arrivals]
    probes = [rng.uniform(0, 40) for _ in range(40)]
    slow, slow_steps = drive(EmulatedEngine("n", PROFILE, limits, LINK, 131072), arrivals, probes)
    fast, fast_steps = drive(FastEngine("n", PROFILE, limits, LINK, 131072), arrivals, probes)
    assert fast_steps == slow_steps
    assert [(k, r) for k, r, _ in fast] == [(k, r) for k, r, _ in slow]
    for (_, _, a), (_, _, b) in zip(fast, slow):
        assert a == pytest.approx(b, abs=1e-9)


def test_next_event_is_the_next_completion_not_the_next_step():
    e = FastEngine("n", PROFILE, EngineLimits(8192, 256, 4.8, 3350.0, 1.0), LINK, 131072)
    e.submit(EngineJob("a", 100, 200), 0.0)
    first = e.advance(e.next_event_s())  # plans the prefill step
    first += e.advance(e.next_event_s())  # ends it
    assert [ev.kind.value for ev in first] == ["first_token"]
    done_at = e.next_event_s()
    assert done_at - first[0].time_s > 199 * 0.0058  # ~199 decode steps of >= 5.8 ms, in one wake
    assert [ev.kind.value for ev in e.advance(done_at)] == ["finished"]


@pytest.mark.parametrize("seed", [4, 5])
def test_fast_engine_load_equals_the_base_engines_at_every_probe(seed):
    """FastEngine.load (cached running totals) reports what EmulatedEngine.load
    does, including with pulled tokens and cached prefixes near the cap."""
    rng = random.Random(seed)
    limits = EngineLimits(8192, 8, 4.8, 3350.0, 1.0)
    arrivals = sorted((rng.uniform(0, 20), (f"r{i}", p, rng.randint(1, 300), rng.choice([0, 512, p - 1, p]),
                                            rng.choice([0, 0, 256])))
                      for i, p in enumerate(rng.randint(50, 8000) for _ in range(40)))
    slow = EmulatedEngine("n", PROFILE, limits, LINK, 131072)
    fast = FastEngine("n", PROFILE, limits, LINK, 131072)
    timeline = sorted([(t, 0, a) for t, a in arrivals] + [(rng.uniform(0, 30), 1, None) for _ in range(60)],
                      key=lambda x: (x[0], x[1]))
    loads = 0
    for t, kind, args in timeline:
        slow.advance(t)
        fast.advance(t)
        if kind == 0:
            rid, p, o, c, f = args
            for engine in (slow, fast):
                engine.submit(EngineJob(rid, p, o, cached_tokens=c, fetch_tokens=f), t)
        assert fast.load() == slow.load()
        loads += fast.load().running_requests > 0
    assert loads > 10  # the probes saw running sequences, not only idle engines
