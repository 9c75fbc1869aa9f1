"""The simulator's synthetic generators (MMPP, Hawkes) and the scaled trace.

Statistical checks use seeded runs long enough that the configured rates
must show: each bound is 5 standard deviations of the count, derived below
from the generator's definition, so a wrong rate or branching ratio fails
while a right one passes for any seed."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload import scaled as workload
from speckv.loadgen.workload.scaled import HASH_BASE, ScaledTrace, hash_base
from speckv.loadgen.workload.synthetic import FamilyShape, HawkesParams, MmppParams, hawkes, mmpp
from speckv.services.common.ids import UINT64_MAX
from speckv.services.scheduler.policies.registry import POLICY_NAMES

SHAPE = FamilyShape(families=50, prefix_blocks=3, max_suffix_blocks=3, block_tokens=16, output_tokens=(5, 9))


def per_second(requests, duration_s: float) -> np.ndarray:
    return np.bincount(np.array([int(r.arrival_s) for r in requests]), minlength=int(duration_s))


# --- both generators ------------------------------------------------------------------

GENERATORS = [
    pytest.param(lambda seed: mmpp(MmppParams(duration_s=600.0, seed=seed), SHAPE), id="mmpp"),
    pytest.param(lambda seed: hawkes(HawkesParams(duration_s=600.0, seed=seed), SHAPE), id="hawkes"),
]


@pytest.mark.parametrize("generate", GENERATORS)
def test_a_seed_gives_one_workload(generate):
    first, again, other = generate(3), generate(3), generate(4)
    assert first == again
    assert [r.arrival_s for r in first] != [r.arrival_s for r in other]


@pytest.mark.parametrize("generate", GENERATORS)
def test_families_and_hash_chains_are_well_formed(generate):
    requests = generate(5)
    assert requests
    times = [r.arrival_s for r in requests]
    assert times == sorted(times) and 0.0 <= times[0] and times[-1] < 600.0
    parent_of: dict[int, int | None] = {}
    prefix_of: dict[str, tuple[int, ...]] = {}
    suffix_seen: set[int] = set()
    for r in requests:
        family = int(r.family.removeprefix("syn-"))
        assert r.family == f"syn-{family}" and 0 <= family < SHAPE.families
        hashes = r.block_hashes
        suffix = hashes[SHAPE.prefix_blocks:]
        assert 1 <= len(suffix) <= SHAPE.max_suffix_blocks
        assert len(set(hashes)) == len(hashes) and all(0 < h < 2**64 for h in hashes)
        # Every hashed block is full; the prompt ends in a partial block.
        assert r.block_tokens == SHAPE.block_tokens and r.full_blocks == len(hashes)
        assert len(hashes) * SHAPE.block_tokens < r.prompt_tokens < (len(hashes) + 1) * SHAPE.block_tokens
        assert SHAPE.output_tokens[0] <= r.output_tokens <= SHAPE.output_tokens[1]
        # One chain per family prefix; suffixes are each request's own.
        assert prefix_of.setdefault(r.family, hashes[:SHAPE.prefix_blocks]) == hashes[:SHAPE.prefix_blocks]
        assert suffix_seen.isdisjoint(suffix)
        suffix_seen.update(suffix)
        # A chained hash always follows the same parent (hash_i = H(hash_{i-1}, block i)).
        for parent, h in zip((None, *hashes), hashes):
            assert parent_of.setdefault(h, parent) == parent
    prefixes = [set(p) for p in prefix_of.values()]
    assert sum(map(len, prefixes)) == len(set().union(*prefixes))  # families share no block
    assert suffix_seen.isdisjoint(set().union(*prefixes))


# --- MMPP ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rate_calm,rate_burst", [(3.0, 3.0), (0.0, 8.0), (4.0, 0.0), (1.0, 10.0)])
def test_mmpp_long_run_rate_is_the_two_states_mix(rate_calm, rate_burst):
    # Together the cases pin each state's rate: (r, r) is plain Poisson, and a
    # silent calm (burst) state leaves the burst (calm) rate times its share.
    p = MmppParams(duration_s=4000.0, rate_calm=rate_calm, rate_burst=rate_burst, calm_s=6.0, burst_s=2.0, seed=11)
    n = len(mmpp(p, SHAPE))
    c, b, t = p.calm_s, p.burst_s, p.duration_s
    mean = (rate_calm * c + rate_burst * b) / (c + b) * t
    # Count = Poisson given the rate path; the path adds (rb - rc)^2 Var(burst
    # time), which for exponential sojourns is ~ 2 t c^2 b^2 / (c + b)^3.
    var = mean + (rate_burst - rate_calm) ** 2 * 2 * t * c * c * b * b / (c + b) ** 3
    assert abs(n - mean) < 5 * math.sqrt(var), (n, mean, math.sqrt(var))


def test_mmpp_is_bursty_where_poisson_is_not():
    """Per-second counts: variance / mean is ~1 for a Poisson stream and far
    above it when the rate switches between calm and burst."""
    def dispersion(rate_calm: float, rate_burst: float) -> float:
        p = MmppParams(duration_s=3000.0, rate_calm=rate_calm, rate_burst=rate_burst, calm_s=20.0, burst_s=5.0, seed=2)
        counts = per_second(mmpp(p, SHAPE), p.duration_s)
        return float(counts.var() / counts.mean())

    assert 0.9 < dispersion(3.0, 3.0) < 1.1
    assert dispersion(1.0, 12.0) > 5.0


def test_mmpp_bursts_focus_on_one_family():
    # No calm arrivals and full focus: every burst is one family, so the
    # family changes at most once per burst (about duration / cycle of them).
    p = MmppParams(duration_s=2000.0, rate_calm=0.0, rate_burst=10.0, calm_s=20.0, burst_s=5.0, burst_focus=1.0,
                   seed=8)
    families = [r.family for r in mmpp(p, SHAPE)]
    changes = sum(a != b for a, b in zip(families, families[1:]))
    bursts = p.duration_s / (p.calm_s + p.burst_s)
    assert len(families) > 10 * bursts and changes < 2 * bursts


def test_mmpp_rejects_impossible_parameters():
    with pytest.raises(ValueError):
        MmppParams(burst_focus=1.5)
    with pytest.raises(ValueError):
        MmppParams(calm_s=0.0)
    with pytest.raises(ValueError):
        MmppParams(rate_burst=-1.0)


# --- Hawkes ------------------------------------------------------------------------------

def test_hawkes_rate_is_mu_over_one_minus_branching_and_stays_there():
    p = HawkesParams(duration_s=6000.0, mu=1.5, branching=0.5, decay=1.0, seed=4)
    times = np.array([r.arrival_s for r in hawkes(p, SHAPE)])
    # Immigrants are Poisson(mu t); each starts a cluster whose size (Poisson
    # offspring, ratio n) has mean 1 / (1 - n) and second moment 1 / (1 - n)^3.
    n = p.branching
    for lo, hi in [(0.0, p.duration_s), *[(q * 1500.0, (q + 1) * 1500.0) for q in range(4)]]:
        count = int(((times >= lo) & (times < hi)).sum())
        span = hi - lo
        mean, sd = p.mu * span / (1 - n), math.sqrt(p.mu * span / (1 - n) ** 3)
        assert abs(count - mean) < 5 * sd, ((lo, hi), count, mean, sd)


@pytest.mark.parametrize("branching", [0.0, 0.3, 0.7])
def test_hawkes_branching_ratio_shows_as_same_family_followers(branching):
    """The share of arrivals whose family arrived within the previous 3 / decay
    seconds estimates the branching ratio: children are that share of all
    arrivals and follow an earlier member of their cluster by Exp(decay). With
    1,000 equally popular families, chance coincidences are rare."""
    shape = FamilyShape(families=1000, zipf_s=0.0, prefix_blocks=2, max_suffix_blocks=1, block_tokens=16)
    p = HawkesParams(duration_s=3000.0, mu=1.0, branching=branching, decay=2.0, seed=6)
    last: dict[str, float] = {}
    followers = 0
    requests = hawkes(p, shape)
    for r in requests:
        if r.arrival_s - last.get(r.family, -math.inf) <= 3.0 / p.decay:
            followers += 1
        last[r.family] = r.arrival_s
    share = followers / len(requests)
    assert branching * (1 - math.exp(-3.0)) - 0.04 < share < branching + 0.04, share


def test_hawkes_refuses_a_branching_ratio_that_never_dies_out():
    with pytest.raises(ValueError, match="stationary"):
        HawkesParams(branching=1.0)
    with pytest.raises(ValueError):
        HawkesParams(decay=0.0)


# --- the scaled trace ------------------------------------------------------------------

def test_scaled_trace_copies_are_disjoint_rotated_replicas():
    base = mmpp(MmppParams(duration_s=300.0, seed=1), SHAPE)
    scaled = ScaledTrace(base, 3)
    assert len(scaled) == 3 * len(base)
    assert np.all(np.diff(scaled.times) >= 0)
    first, last = base[0].arrival_s, base[-1].arrival_s
    stride = max(h for r in base for h in r.block_hashes) + 1
    by_copy: dict[int, list] = {0: [], 1: [], 2: []}
    for i in range(len(scaled)):
        r = scaled[i]
        k = int(r.family[1]) if r.family.startswith("c") else 0
        by_copy[k].append(r)
        assert first <= r.arrival_s <= last + 1e-3
        assert scaled.family_of(i) == r.family
    hashes = [{h for r in rs for h in r.block_hashes} for rs in by_copy.values()]
    assert not (hashes[0] & hashes[1] or hashes[0] & hashes[2] or hashes[1] & hashes[2])
    for k, rs in by_copy.items():
        originals = sorted(base, key=lambda r: (r.prompt_tokens, r.output_tokens, r.block_hashes))
        copies = sorted(rs, key=lambda r: (r.prompt_tokens, r.output_tokens, r.block_hashes))
        for o, c in zip(originals, copies, strict=True):
            assert c.block_hashes == tuple(HASH_BASE + h + k * stride for h in o.block_hashes)
            assert c.family == (f"c{k}:{o.family}" if k else o.family)
    lo, hi = scaled.window(100.0, 160.0)
    assert all(100.0 <= t < 160.0 for t in scaled.times[lo:hi])
    assert scaled.counts(100.0, 160.0) == Counter(scaled.family_of(i) for i in range(len(scaled))
                                                  if 100.0 < scaled.times[i] <= 160.0)
    first: dict[str, float] = {}
    for i in range(len(scaled)):
        if 100.0 < scaled.times[i] <= 160.0:
            first.setdefault(scaled.family_of(i), float(scaled.times[i]))
    assert scaled.first_arrivals(100.0, 160.0) == first


def test_simulated_hashes_sit_at_two_to_the_62_and_stay_uint64():
    base = mmpp(MmppParams(duration_s=60.0, seed=2), SHAPE)
    scaled = ScaledTrace(base, 4)
    hashes = [h for i in range(len(scaled)) for h in scaled[i].block_hashes]
    assert HASH_BASE == 2**62 and min(hashes) > HASH_BASE and max(hashes) <= UINT64_MAX
    assert hash_base(stride=2**60, copies=4) == HASH_BASE  # 2**62 + 4 x 2**60 - 1 is still uint64
    assert hash_base(stride=2**61, copies=7) == 0  # a trace with 64-bit hashes keeps its own
    with pytest.raises(ValueError, match="exceed uint64"):
        hash_base(stride=2**62, copies=5)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_results_do_not_depend_on_the_hash_base(policy, monkeypatch):
    """Hashes are only compared: every policy's run is the same with the trace's own numbers."""
    config = load_e2e_config()
    settings = SimSettings.from_e2e(config, nodes=8)
    base = mmpp(MmppParams(duration_s=40.0, rate_calm=6.0, rate_burst=30.0, calm_s=10.0, burst_s=5.0, seed=3),
                FamilyShape(families=20, prefix_blocks=6, max_suffix_blocks=3, block_tokens=config.block_tokens))

    def outcome():
        scaled = ScaledTrace(base, 2)
        run = Simulation(config, settings, policy, list(scaled), future=scaled).run()
        return ([(r.node_id, r.cached_tokens, r.fetched_tokens, r.ttft_ms, r.replica_blocks) for r in run.records],
                run.replicas, run.orders, run.network_bytes)

    lifted = outcome()
    monkeypatch.setattr(workload, "HASH_BASE", 0)
    assert outcome() == lifted
