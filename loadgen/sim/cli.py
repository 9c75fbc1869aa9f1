"""`speckv simulate`: the end-to-end comparison in virtual time, at any
number of nodes, with the JSON keys and report of `speckv bench e2e` plus
wall time and simulated events per second.

    speckv simulate --trace PATH --nodes 8,64,256,1024 --policies ... [--json PATH] [--report DIR]
    speckv simulate --synthetic SCENARIO [--scenarios PATH] --nodes 64 ...

--synthetic names a scenario of services/config/scenarios.json (or of the
file given by --scenarios): a generator (Markov-modulated Poisson or
Hawkes) with its parameters, sized for the configuration's node count, and
scaled with copies like a trace.

Each (node count, policy) is one simulation (jobs.py) in a worker process of
its own (pool.py; --jobs at once, default one more than the cores). The
trace is replayed whole by default (--start-s / --duration-s pick a slice);
for more nodes than the configuration's it is merged with time-rotated
copies of itself (workload/scaled.py), which the notes say. Burst windows
are fixed from the whole (scaled) workload, as bench e2e fixes them from the
trace. comparison.py gathers the results, prints the tables and writes the
JSON and reports.

--compiled (default auto): the workers run on the mypyc-compiled build of the
hot modules (compiled.py; `make sim-compiled` builds it) when it matches the
source, else on the source; the console and the JSON's "code" say which.

--ray [ADDRESS] runs the same simulations as Ray tasks instead (ray_pool.py;
the `ray` extra): on a local Ray instance started for the command (--jobs
CPUs), or on the cluster at ADDRESS (auto, ray://HOST:PORT or HOST:PORT).
The results are the pool's, bit for bit.

The predictor runs only in the simulations of the policies that read its
forecasts (FORECAST_POLICIES: predictive), so only their report time lines
draw forecasts; the live bench draws the same line for every policy.
--predictor lightgbm trains the model once, before any worker starts
(jobs.py says on what); --predictor online refits it inside each
simulation, in virtual time, from the arrivals it routes (online_counts.py).

--sweep KEY=V1,V2 (link, profile; repeatable) runs every cell of their
cartesian product, each on the base configuration with that cell's values
(sweep.py), every policy at every node count, on the one pool, and prints
and writes the regime map (regime.py): per cell and policy the figures
placement can change, and a heat map in the report.

A policy named `predictive-without-retain` (or -replicate, -prefetch, -stage; oracle
too) runs that policy with the action turned off (ablation.py); beside its
policy it measures what the action saved, printed and written under
"ablation" in the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from speckv.loadgen.experiments.e2e_config import E2EConfig, load_e2e_config
from speckv.loadgen.sim.ablation import ablation_table, parse_variant
from speckv.loadgen.sim.comparison import (
    ablation_of,
    assemble,
    print_seed_tables,
    print_tables,
    with_seed_repeats,
    write_reports,
)
from speckv.loadgen.sim.disk_tiers import disk_tier_rows, disk_tier_table
from speckv.loadgen.sim.jobs import Job, train_once, train_returns_once
from speckv.loadgen.sim.machine import describe_machine
from speckv.loadgen.sim.pool import compiled_build, default_jobs, run_all
from speckv.loadgen.sim.predictor import PREDICTOR_KINDS
from speckv.loadgen.sim.ray_pool import LOCAL, RayTarget, preflight, run_on_ray
from speckv.loadgen.sim.regime import finish_sweep
from speckv.loadgen.sim.sweep import parse_sweeps, resolve_cells
from speckv.loadgen.workload.node_events import get_event_set, load_event_sets
from speckv.loadgen.workload.scenarios import get_scenario, load_scenarios, parse_seeds
from speckv.services.cluster.status import wide_console
from speckv.services.common.errors import InvalidArgument, NotFound

ALL_POLICIES = "none,reactive-heat,reactive-migrate,affinity,predictive,oracle"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="speckv simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", help="trace file (Mooncake JSONL, Azure or BurstGPT CSV)")
    p.add_argument("--synthetic", metavar="SCENARIO",
                   help="a named synthetic bursty workload instead of --trace (see --scenarios)")
    p.add_argument("--scenarios", default=None,
                   help="scenario file for --synthetic (default: the committed services/config/scenarios.json: "
                        f"{', '.join(load_scenarios())})")
    p.add_argument("--nodes", default=None, help="node count, or a comma-separated list (default: the config's)")
    p.add_argument("--policies", default=ALL_POLICIES, help="comma-separated")
    p.add_argument("--load-nodes", type=int, default=None, metavar="N",
                   help="size the workload for N nodes (its copies) at every --nodes count, so the counts serve one "
                        "workload and nodes_needed compares like with like (default: each count its own load)")
    p.add_argument("--start-s", type=float, default=None, help="slice start, trace s (default: the first arrival)")
    p.add_argument("--duration-s", type=float, default=None, help="slice length, trace s (default: to the end)")
    p.add_argument("--predictor", choices=PREDICTOR_KINDS, default="builtin",
                   help="builtin EWMA (as the live cluster), LightGBM trained on the trace before the slice, or "
                        "online: the EWMA until LightGBM refitted every 300 virtual s on the arrivals the "
                        "simulation routed validates (the live predictor's --retrain-interval-s; online_counts.py)")
    p.add_argument("--train-trace", default=None,
                   help="with --predictor lightgbm: train on the whole of this other trace instead of the "
                        "replayed trace's time before the slice")
    p.add_argument("--returns", choices=("on", "off"), default="on",
                   help="forecast-reading policies also plan on session-return forecasts, from a model "
                        "trained on the trace before the slice (default on; off: family bursts alone)")
    p.add_argument("--online-learning", choices=("on", "off"), default="off",
                   help="the session-return model fits itself from the slice's arrivals and turn ends in virtual "
                        "time (services/config/predictor.json, session_return.online), with the --returns model "
                        "as its warm start where there is one (default off: the committed figures)")
    p.add_argument("--returns-train-trace", default=None,
                   help="train the --returns model on the whole of this other trace instead of the replayed "
                        "trace's time before the slice (a warm start for a replay from the first arrival)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="match a live run replayed this many times faster (its wall-clock intervals, in trace s)")
    p.add_argument("--seed", type=int, default=7, help="synthetic workload seed")
    p.add_argument("--seeds", default=None, metavar="S1,S2,...|SET",
                   help="with --synthetic: run every policy on each of these realizations, or on a named set of "
                        "the scenarios file (evaluation: the seeds verdicts read; tuning: where choices are made) "
                        "(the first is the one "
                        "the tables, report and ablation show) and give each figure's difference from none a 95 %% "
                        "interval between seeds (repeats.py)")
    p.add_argument("--jobs", type=int, default=None,
                   help="simulations run at once (default: one more than the machine's cores, see default_jobs)")
    p.add_argument("--compiled", choices=("auto", "on", "off"), default="auto",
                   help="run the workers on the mypyc-compiled modules (make sim-compiled builds them; about 2x "
                        "faster, identical results): auto uses them when they match the source, on requires them")
    p.add_argument("--compiled-dir", default=None,
                   help="where the compiled build is (default: build/sim-compiled at the project root)")
    p.add_argument("--ray", nargs="?", const=LOCAL, default=None, metavar="ADDRESS",
                   help="run the simulations as Ray tasks (pip install -e '.[ray]'): alone, on a local Ray "
                        "started with --jobs CPUs; with ADDRESS (auto, ray://HOST:PORT, HOST:PORT) on that cluster")
    p.add_argument("--host-pages", type=int, default=None,
                   help="each node's host tier in blocks (default: the config's cluster.host_pages; 0 turns the "
                        "host tier off)")
    p.add_argument("--disk-blocks", default=None, metavar="N[,N...]",
                   help="each node's disk tier below its host tier, in blocks, read at the config's cluster.disk "
                        "profile (services/config/disks.json, default nvme-gen4) (default: the config's "
                        "cluster.disk_pages, 0: none; needs a host tier). Several sizes (e.g. 0,57216) run every "
                        "policy with each and print the disk-tier table: returning p99 ratios with paired 95 %% "
                        "bootstrap intervals (disk_tiers.py); the other tables are the first size's")
    p.add_argument("--config", default=None, help="e2e config JSON (default: the committed one)")
    p.add_argument("--json", default=None, help="write the result JSON here")
    p.add_argument("--report", default=None, help="write the HTML report(s) into this directory")
    p.add_argument("--events", default=None, metavar="NAME",
                   help="replay a node event set (node loss, node addition) of services/config/events.json (or "
                        "--events-file): " + ", ".join(load_event_sets()))
    p.add_argument("--events-file", default=None, help="the file of --events sets (default: the committed one)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="run every cell of the product of the sweeps (keys: link, profile; repeat the flag per "
                        "key), e.g. --sweep link=tcp-25g,eth-100g,rdma-400g --sweep profile=llama-3-8b-h100-vidur")
    args = p.parse_args(list(argv))
    if args.train_trace and args.predictor != "lightgbm":
        raise InvalidArgument("--train-trace trains the LightGBM predictor: give --predictor lightgbm too")
    if bool(args.trace) == bool(args.synthetic):
        raise InvalidArgument("give exactly one of --trace PATH and --synthetic SCENARIO")
    if args.scenarios and not args.synthetic:
        raise InvalidArgument("--scenarios names the file of --synthetic scenarios: give --synthetic too")
    args.sweeps = parse_sweeps(args.sweep)
    args.ray_target = RayTarget.parse(args.ray) if args.ray is not None else None
    if args.events_file and not args.events:
        raise InvalidArgument("--events-file names the file of --events sets: give --events too")
    if args.events:  # an unknown set or a bad file fails here, before any worker starts
        get_event_set(args.events, args.events_file)
    args.policy_list = [x.strip() for x in args.policies.split(",") if x.strip()]
    for name in args.policy_list:
        parse_variant(name)  # a bad ablation name fails here, before any worker starts
    if not args.policy_list or len(set(args.policy_list)) != len(args.policy_list):
        raise InvalidArgument(f"--policies={args.policies!r}: name each policy once")
    try:
        args.node_list = [int(x) for x in args.nodes.split(",")] if args.nodes else []
    except ValueError:
        raise InvalidArgument(f"--nodes={args.nodes!r}: expected integers, e.g. 8,64,256") from None
    args.seed_list = _seeds(args)
    if args.host_pages is not None and args.host_pages < 0:
        raise InvalidArgument(f"--host-pages={args.host_pages}: must be >= 0 (0: no host tier)")
    args.disk_list = _disk_sizes(args)
    if args.load_nodes is not None and args.load_nodes < 1:
        raise InvalidArgument(f"--load-nodes={args.load_nodes}: must be >= 1")
    if any(n < 1 for n in args.node_list) or (args.jobs is not None and args.jobs < 1) or args.speed <= 0:
        raise InvalidArgument("--nodes >= 1, --jobs >= 1 and --speed > 0 are required")
    return args


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    args = parse_args(argv)
    for path in (args.trace, args.train_trace):
        if path and not Path(path).exists():
            raise NotFound(f"trace {path} not found")
    config = load_e2e_config(args.config)
    cells = resolve_cells(args.sweeps, args.config) if args.sweeps else []  # bad values fail before any worker
    code_path, code_line = compiled_build(args.compiled, args.compiled_dir)
    if args.ray_target is not None:  # Ray missing or its address dead fails before any training
        preflight(args.ray_target)
    nodes = args.node_list or [config.nodes]
    source = str(Path(args.trace).resolve()) if args.trace else args.synthetic
    scenarios = str(Path(args.scenarios).resolve()) if args.scenarios else None
    if args.synthetic:  # a bad name or file fails here, before any worker starts
        get_scenario(args.synthetic, args.seed_list[0], config.block_tokens, scenarios)
    jobs = [Job(source, seed, n, p, args.start_s, args.duration_s, args.predictor, args.speed, args.config,
                synthetic=bool(args.synthetic), scenarios_path=scenarios, host_pages=args.host_pages, cell=cell,
                disk_pages=disk, events=args.events, load_nodes=args.load_nodes,
                online_learning=args.online_learning == "on",
                events_path=str(Path(args.events_file).resolve()) if args.events_file else None)
            for seed in args.seed_list for cell in ([c.key for c in cells] or [()]) for disk in args.disk_list
            for n in nodes for p in args.policy_list]
    console = wide_console()
    console.print(code_line, markup=False)
    machine = describe_machine()
    began = time.perf_counter()
    jobs = _with_models(args, config, jobs, console)
    if args.ray_target is not None:
        ran = run_on_ray(jobs, args.ray_target, args.jobs, console, code_path, environ)
        results, workers = ran.results, ran.workers
    else:
        workers = min(args.jobs or default_jobs(os.cpu_count() or 1), len(jobs))
        results = run_all(jobs, workers, console, code_path, environ)
    args.wall_s = time.perf_counter() - began
    if cells:
        return finish_sweep(args.sweeps, cells, results, args, machine, workers, console)
    disk_rows = disk_tier_rows(results, [d or 0 for d in args.disk_list]) if len(args.disk_list) > 1 else []
    results = [r for r in results if r.disk_pages == args.disk_list[0]]
    every_seed, results = results, [r for r in results if r.seed == args.seed_list[0]]
    comparison = assemble(results, args, config, machine)
    with_seed_repeats(comparison, every_seed, args.seed_list)
    print_tables(comparison, console)
    if len(args.seed_list) > 1:
        print_seed_tables(comparison, args.seed_list, console)
    ablation = ablation_of(results)
    if ablation:
        console.print(f"what each action measurably saved (ablation.py):\n{ablation_table(ablation)}", markup=False)
    if disk_rows:
        console.print(f"the disk tier (disk_tiers.py: returning p99 ratios on the same requests, paired 95 % "
                      f"bootstrap intervals; the tables above are {args.disk_list[0]} blocks'):\n"
                      f"{disk_tier_table(disk_rows)}", markup=False)
    totals = comparison.simulated
    assert totals is not None
    console.print(f"wall {args.wall_s:.1f} s for {len(jobs)} simulations in {workers} workers; "
                  f"{totals.simulated_events} events, {totals.events_per_s:.0f} events per CPU second; "
                  f"{machine['cores']} cores, reference loop {machine['reference_loop_ms']:.1f} ms (machine.py)")
    if args.json:
        Path(args.json).write_text(json.dumps({**comparison.to_json(), "ablation": [r.to_json() for r in ablation],
                                               **({"disk_tiers": [r.to_json() for r in disk_rows]} if disk_rows else {})},
                                              indent=2))
        console.print(f"JSON written to {args.json}")
    if args.report:
        write_reports(comparison, results, Path(args.report), console)
    return 1 if any(m.served == 0 for row in totals.by_nodes.values() for m in row.policies.values()) else 0


def _disk_sizes(args: argparse.Namespace) -> list[int | None]:
    """--disk-blocks as a list of distinct sizes ([None]: the configuration's)."""
    if args.disk_blocks is None:
        return [None]
    try:
        sizes = [int(x) for x in str(args.disk_blocks).split(",") if x.strip()]
    except ValueError:
        raise InvalidArgument(f"--disk-blocks={args.disk_blocks!r}: expected integers, e.g. 0,57216") from None
    if not sizes or len(set(sizes)) != len(sizes) or any(n < 0 or (n and args.host_pages == 0) for n in sizes):
        raise InvalidArgument(f"--disk-blocks={args.disk_blocks}: distinct sizes >= 0 (0: no disk tier), each "
                              "but 0 needing a host tier (--host-pages > 0)")
    if len(sizes) > 1 and (args.sweeps or len(args.seed_list) > 1):
        raise InvalidArgument("several --disk-blocks sizes do not combine with --sweep or --seeds: run them apart")
    return list(sizes)


def _seeds(args: argparse.Namespace) -> list[int]:
    """--seeds, else --seed alone."""
    if args.seeds is None:
        return [args.seed]
    if not args.synthetic:
        raise InvalidArgument("--seeds picks realizations of a --synthetic scenario: a trace has one")
    if args.sweeps:
        raise InvalidArgument("--seeds and --sweep do not combine: run the sweep per seed")
    return parse_seeds(args.seeds, args.scenarios)


def _with_models(args: argparse.Namespace, config: E2EConfig, jobs: list[Job], console) -> list[Job]:
    """The jobs with the models trained before the slice, once per seed
    (each realization has its own history before the slice)."""
    out: list[Job] = []
    for seed in args.seed_list:
        mine = [j for j in jobs if j.seed == seed]
        trained = train_once(args, config, mine[0], console)
        if trained is not None:
            mine = [replace(j, trained=trained) for j in mine]
        returns = train_returns_once(args, config, mine[0], console)
        if returns is not None:
            mine = [replace(j, returns=returns) for j in mine]
        out.extend(mine)
    return out

