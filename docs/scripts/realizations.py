"""Verdicts over realizations: a policy against a baseline on each (scenario,
seed) cell, once per router tie-break seed (heldout_seeds.py's rseedK variant),
so the spread a different early route makes is seen beside the difference.

    WORKERS=2 PYTHONHASHSEED=0 PYTHONPATH=$PWD/.shim .venv/bin/python docs/scripts/heldout_seeds.py OUT.jsonl \
        document-bursts,agent-cascades,agent-fanout 7,11,13 \
        predictive,reactive-heat,predictive:rseed1,reactive-heat:rseed1,predictive:rseed2,reactive-heat:rseed2
    python docs/scripts/realizations.py OUT.jsonl predictive reactive-heat [burst_ttft_p99_ms]

A policy without a variant is the committed router seed. Prints, per cell, the
policy's and the baseline's figure in each realization, their differences and
the mean difference, and per scenario the mean over its cells' realizations
with the range.
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def realization(policy: str) -> tuple[str, int]:
    base, _, variant = policy.partition(":")
    return base, int(variant[5:]) if variant.startswith("rseed") else 0


def main(path: str, policy: str, baseline: str, metric: str = "burst_ttft_p99_ms") -> None:
    figures: dict[tuple[str, int], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    with open(path) as f:
        for line in f:
            run = json.loads(line)
            base, k = realization(run["policy"])
            figures[(run["scenario"], run["seed"])][base][k] = run[metric]
    print(f"| scenario | seed | {policy} | {baseline} | differences | mean |")
    print("|---|---:|---|---|---|---:|")
    by_scenario: dict[str, list[float]] = defaultdict(list)
    for (scenario, seed), cell in sorted(figures.items()):
        ks = sorted(set(cell[policy]) & set(cell[baseline]))
        if not ks:
            continue
        ours, theirs = [cell[policy][k] for k in ks], [cell[baseline][k] for k in ks]
        diffs = [a - b for a, b in zip(ours, theirs)]
        by_scenario[scenario] += diffs
        print(f"| {scenario} | {seed} | {' / '.join(f'{x:.0f}' for x in ours)} | "
              f"{' / '.join(f'{x:.0f}' for x in theirs)} | {' / '.join(f'{d:+.0f}' for d in diffs)} | "
              f"{statistics.mean(diffs):+.0f} |")
    for scenario, diffs in sorted(by_scenario.items()):
        print(f"{scenario}: mean {statistics.mean(diffs):+.0f} over {len(diffs)} realizations "
              f"(range {min(diffs):+.0f} to {max(diffs):+.0f}; {sum(d < 0 for d in diffs)} below 0)")


if __name__ == "__main__":
    main(*sys.argv[1:])
