"""`speckv bench returns [--traces DIR] [--trace NAME] [--quick] [--json OUT] [--save DIR] [--tune-recalibration]`.

Session-return foresight on the Mooncake conversation trace (a family is a
conversation; services/predictor/{serving,fitting,judging}/returns). Every turn end gets a feature row
from the online builder; the trace's time is split chronologically: the last
eval_fraction (30 %) is evaluated, earlier turn ends train (labels censored
at the split, the newest 20 % of each horizon's usable rows for early
stopping). Per horizon it prints rows, base rate, AUC, Brier and ECE of the
LightGBM model and of the baselines (constant training rate, training rate
by turn index, by gap since the previous turn), the calibration table at
300 s, training time and predict time per row, and writes it all to --json.
It then replays the whole trace through a ReturnTracker (the online core)
and scores its conditional forecasts ("back within t of now, given not back
yet") every 30 s of the evaluated slice, beside the constant rates put
through the same survival curve (what idle time alone says).

Recalibration (services/predictor/serving/returns/recalibration.py): "lgb+recal"
is the LightGBM model with the configured online level recalibration
(`session_return.recalibration`; scored whether or not it is enabled, so
the two can be compared), replayed over every turn end in time order, each
row shifted by what had resolved by its own end; the tracker replay runs
it too. The target is judged on the model the config serves (recalibrated
when enabled). --tune-recalibration first scores the candidate settings on
validation cuts before the evaluated slice only (tuning.py) and prints
them with the one its rule picks; it never reads the evaluated slice.
Hyperparameters: the `session_return` section of
services/config/predictor.json, fixed; nothing is tuned on the evaluated
rows. Target of issue 21 (reported, not tuned to): AUC >= 0.75 and ECE <=
0.05 for "returns within 300 s".

--save DIR writes the evaluated model (trained on turn ends before the
evaluated slice only) as a return-model directory the predictor serves:
`speckv predictor --returns-model DIR` (services/predictor/serving/returns/store.py).

The live e2e bench's model (train_for_replay, ReplayReturns) is trained the
same way on the trace before its replayed slice, on the replay's clock.

Timestamps in the trace are quantised to ~3 s and turn ends come from a
service-time model, so a return delay is known to a few seconds only: a
30 s label flips for returns within a few seconds of the boundary, and
returns within 30 s are rare (~2 % of turn ends), so the shortest horizon's
scores rest on few, noisy positives.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from speckv.services.common.traces import TraceRequest, resolve_traces_dir
from speckv.services.common.traces.mooncake import load_mooncake
from speckv.services.predictor.fitting.returns.baselines import fit_baselines
from speckv.services.predictor.fitting.returns.config import ReturnConfig, load_return_config
from speckv.services.predictor.fitting.returns.dataset import Split, build_rows
from speckv.services.predictor.fitting.returns.model_training import train_return_model
from speckv.services.predictor.fitting.returns.training import train_before
from speckv.services.predictor.fitting.returns.tuning import (
    DEFAULT_CUTS_S,
    DEFAULT_GRID,
    choose,
    validate_recalibration,
)
from speckv.services.predictor.fitting.returns.turns import TurnRecord, build_turns
from speckv.services.predictor.judging.returns import evaluation
from speckv.services.predictor.serving.returns.recalibration import RecalibrationSpec, recalibrate_rows
from speckv.services.predictor.serving.returns.store import PastTurn, save_return_model, write_past_turns
from speckv.services.predictor.serving.returns.survival import Tail, monotone
from speckv.services.predictor.serving.returns.tracker import ReturnTracker

DEFAULT_TRACE = "mooncake_conversation_trace.jsonl"
CALIBRATION_HORIZON_S = 300.0
TARGET = {"auc_min": 0.75, "ece_max": 0.05, "horizon_s": CALIBRATION_HORIZON_S}
QUANTISATION_NOTE = ("Mooncake timestamps are quantised to ~3 s and turn ends come from a service-time model, so "
                     "return delays are known to a few seconds: short horizons (30 s) have noisy labels near the "
                     "boundary and few positives.")
SINGLE_ROW_CALLS = 200
SNAPSHOT_S = 30.0  # tracker replay: forecasts scored every this many seconds of the evaluated slice
RECAL = "lgb+recal"


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    args = _parse(argv)
    path = Path(args.trace)
    if not path.exists():
        path = resolve_traces_dir(args.traces, environ) / args.trace
    config = load_return_config(args.config, quick=args.quick)
    H = config.horizons_s
    requests = load_mooncake(path, family="conversation")
    if not requests:
        print(f"trace {path}: no requests", file=sys.stderr)
        return 2
    turns = build_turns(requests, config.service)
    began = time.perf_counter()
    rows = build_rows(turns, config.features)
    features_s = time.perf_counter() - began
    split = Split.of(min(r.arrival_s for r in requests), max(r.arrival_s for r in requests), config.eval_fraction)
    train, test = split.train(rows), split.evaluated(rows)
    print(f"trace {path.name}: {len(requests)} requests, {len({t.conversation for t in turns})} conversations, "
          f"{len(turns)} turns ({len(turns) - len(rows)} overlapped: next turn before the modelled end); "
          f"train on turn ends < {split.eval_start_s:.0f} s, evaluate on [{split.eval_start_s:.0f}, "
          f"{split.data_end_s:.0f}] s", flush=True)

    tuned = _tune(rows, config, split, args.tune_cuts) if args.tune_recalibration else None
    model = train_return_model(train, H, split.eval_start_s, config.lightgbm, config.validation_fraction)
    baselines = fit_baselines(train, H, split.eval_start_s, config.turn_edges, config.gap_edges_s,
                              config.prior_rows)
    known, labels = test.known(H, split.data_end_s), test.labels(H)
    t0 = time.perf_counter()
    p_model = model.predict_cdf(test.X)
    predict_batch_s = time.perf_counter() - t0
    # The recalibration replays every row (training ones too: the evidence at the slice's start is theirs).
    recal = RecalibrationSpec(True, config.recalibration.window_s, config.recalibration.prior_rows,
                              config.recalibration.max_shift_logit)
    p_all, shifts = recalibrate_rows(rows.end_s, rows.delay_s, model.predict_cdf(rows.X), H, recal)
    evaluated = rows.end_s >= split.eval_start_s
    forecasts = {"lightgbm": p_model, RECAL: p_all[evaluated], **{b.name: b.predict(test) for b in baselines}}
    models: dict[str, dict[str, Any]] = {}
    for name, p in forecasts.items():
        models[name] = {f"h{h:g}": evaluation.score(p[known[:, i], i], labels[known[:, i], i])
                        for i, h in enumerate(H)}
    cal = H.index(CALIBRATION_HORIZON_S) if CALIBRATION_HORIZON_S in H else len(H) - 1
    calibration = {name: evaluation.calibration_table(p[known[:, cal], cal], labels[known[:, cal], cal])
                   for name, p in forecasts.items()}
    single_s = _single_row_s(model, test.X)
    constant = _ConstantCdf(H, model.feature_names, model.tail, baselines[0].rates)
    tracker = _replay_tracker({"lightgbm": model, RECAL: model, "constant": constant}, config, turns, split,
                              {RECAL: recal})
    served = RECAL if config.recalibration.enabled else "lightgbm"
    report = {
        "trace": path.name, "quick": args.quick, "load_average_1m": os.getloadavg()[0],
        "requests": len(requests), "conversations": len({t.conversation for t in turns}), "turns": len(turns),
        "overlapped_turns": len(turns) - len(rows), "rows": len(rows), "train_rows_all": len(train),
        "evaluated_rows_all": len(test), "horizons_s": list(H), "eval_start_s": split.eval_start_s,
        "data_end_s": split.data_end_s, "features": list(rows.names),
        "training": [{"horizon_s": f.horizon_s, "train_rows": f.train_rows, "validation_rows": f.validation_rows,
                      "base_rate": f.base_rate, "trees": f.trees, "validation_auc": f.validation_auc}
                     for f in model.fits],
        "tail": {"offsets_s": list(model.tail.offsets_s), "ratio": list(model.tail.ratio)} if model.tail else None,
        "features_s": features_s, "train_s": model.train_s, "train_cpu_s": model.extra["train_cpu_s"],
        "predict_us_per_row_batch": 1e6 * predict_batch_s / max(len(test), 1),
        "predict_us_single_row": 1e6 * single_s,
        "models": models, "calibration_horizon_s": H[cal], "calibration": calibration, "tracker": tracker,
        "recalibration": {**config.recalibration.to_dict(), "served": served,
                          "mean_shift_logit_evaluated": {f"h{h:g}": float(shifts[evaluated, i].mean()) if
                                                         evaluated.any() else math.nan for i, h in enumerate(H)},
                          "validation": tuned},
        "target": {**_target(models[served].get(f"h{CALIBRATION_HORIZON_S:g}")), "model": served},
        "notes": [QUANTISATION_NOTE],
    }
    if args.save:
        version = f"returns-{path.stem}-before-{split.eval_start_s:.0f}s{'-quick' if args.quick else ''}"
        save_return_model(args.save, model, config.features, version,
                          f"session-return LightGBM trained on the turn ends of {path.name} before "
                          f"{split.eval_start_s:.0f} s (labels censored there)", config.recalibration)
        report["saved"] = {"directory": str(args.save), "version": version}
    _print(report)
    if args.save:
        print(f"saved the model to {args.save} (version {report['saved']['version']}): "
              f"speckv predictor --returns-model {args.save}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=_json_default), encoding="utf-8")
    return 0


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="speckv bench returns", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=DEFAULT_TRACE, help=f"Mooncake trace file or name in the traces directory "
                                                          f"(default {DEFAULT_TRACE})")
    p.add_argument("--traces", default=None, help="traces directory (default: SPECKV_TRACES, ../shared/traces)")
    p.add_argument("--quick", action="store_true", help="fewer boosting rounds (session_return.quick)")
    p.add_argument("--config", default=None, help="hyperparameter file (default: services/config/predictor.json)")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--save", default=None, help="write the model (trained before the evaluated slice only) to this "
                                                "directory, for speckv predictor --returns-model DIR")
    p.add_argument("--tune-recalibration", action="store_true",
                   help="score the recalibration candidates on validation cuts before the evaluated slice "
                        "(never on it) and print the one the rule picks")
    p.add_argument("--tune-cuts", default=",".join(f"{c:g}" for c in DEFAULT_CUTS_S),
                   help="validation cuts in trace seconds, before the evaluated slice (default %(default)s)")
    return p.parse_args(argv)


@dataclass(frozen=True, slots=True)
class ReplayReturns:
    """The session-return model of one live replay: trained on the trace
    before the slice, on the replay's clock (training.train_before: times,
    horizons and windows / speed), saved in `directory` for the predictor's
    --returns-model; and
    the history before the slice that warms its tracker (--returns-warm)."""

    directory: Path
    version: str
    history: tuple[TraceRequest, ...]  # requests before the slice, trace time
    config: ReturnConfig
    slice_start_s: float
    description: str

    def predictor_args(self, to_clock: Callable[[float], float], warm_path: Path) -> list[str]:
        """Writes the warm file (every request before the slice: its arrival
        and, when it ended before the slice, its modelled end, as
        loadgen/sim/returns.warm feeds the simulator's tracker), each time
        mapped by to_clock (trace s -> the services' clock); returns the
        predictor's flags. The warm start then routes the last warmup_s of
        that history again: the predictor recognises those arrivals as the
        ones it holds (serving.py)."""
        turns = []
        for r in self.history:
            end = r.arrival_s + self.config.service(r.prompt_tokens, r.output_tokens)
            turns.append(PastTurn(r.family, to_clock(r.arrival_s), to_clock(end) if end < self.slice_start_s else None,
                                  r.prompt_tokens, r.output_tokens, r.follow_ups))
        write_past_turns(warm_path, turns)
        return ["--returns-model", str(self.directory), "--returns-warm", str(warm_path)]


def train_for_replay(trace: Sequence[TraceRequest], slice_start_s: float, speed: float, directory: Path
                     ) -> ReplayReturns | None:
    """The return model of a replay of trace from slice_start_s at speed x,
    trained on every request before the slice (never one of it); None when
    fewer than training.MIN_TRAINING_TURNS turns precede the slice."""
    config = load_return_config()
    history = tuple(r for r in trace if r.arrival_s < slice_start_s)
    trained = train_before(history, slice_start_s, config, speed)
    if trained is None:
        return None
    version = f"e2e-returns-before-{slice_start_s:g}s-x{speed:g}"
    description = (f"session-return LightGBM {version} trained on {trained.turns} turns before {slice_start_s:g} s "
                   f"of trace (labels censored there), on the replay's clock (times, horizons and windows / {speed:g})")
    save_return_model(directory, trained.model, trained.spec, version, description, trained.recalibration)
    return ReplayReturns(directory, version, history, config, slice_start_s, description)


def _tune(rows, config: ReturnConfig, split: Split, cuts_arg: str) -> dict[str, Any]:
    """The recalibration search of tuning.py on rows before the evaluated
    slice; prints one line per candidate and the choice."""
    cuts = tuple(float(c) for c in cuts_arg.split(",") if c.strip())
    began = time.perf_counter()
    candidates = validate_recalibration(rows, config.horizons_s, split.eval_start_s, cuts, config.lightgbm,
                                        config.validation_fraction, DEFAULT_GRID)
    chosen = choose(candidates, CALIBRATION_HORIZON_S)
    key = [f"h{CALIBRATION_HORIZON_S:g}"]
    print(f"recalibration candidates on validation (cuts {', '.join(f'{c:g}' for c in cuts)} s, rows before "
          f"{split.eval_start_s:.0f} s only; {time.perf_counter() - began:.0f} s): mean Brier over cuts x horizons, "
          f"mean ECE, mean ECE and AUC at {CALIBRATION_HORIZON_S:g} s")
    table = []
    for c in candidates:
        name = "off" if c.spec is None else f"window {c.spec.window_s:g} prior {c.spec.prior_rows:g} " \
                                           f"max {c.spec.max_shift_logit:g}"
        line = {"spec": None if c.spec is None else c.spec.to_dict(), "brier": c.mean("brier"), "ece": c.mean("ece"),
                "ece_cal": c.mean("ece", key), "auc_cal": c.mean("auc", key), "scores": c.scores}
        table.append(line)
        mark = " <- chosen" if c is chosen else ""
        print(f"  {name:<32}{line['brier']:.5f} {line['ece']:.4f} {line['ece_cal']:.4f} {line['auc_cal']:.4f}{mark}")
    return {"cuts_s": list(cuts), "rule": "lowest mean Brier; kept only if it beats off on it and does not worsen "
                                         "the mean ECE at the calibration horizon",
            "chosen": None if chosen.spec is None else chosen.spec.to_dict(), "candidates": table}


def _single_row_s(model, X: np.ndarray) -> float:
    """Mean seconds of one predict_cdf call on one row (what a live turn end costs)."""
    if not len(X):
        return math.nan
    rows = [X[i % len(X)][None, :] for i in range(SINGLE_ROW_CALLS)]
    began = time.perf_counter()
    for row in rows:
        model.predict_cdf(row)
    return (time.perf_counter() - began) / len(rows)


@dataclass(frozen=True, slots=True)
class _ConstantCdf:
    """The constant baseline as a tracker model: every row gets the training
    base rates, made monotone, and the model's tail: what idle time alone says."""

    horizons_s: tuple[float, ...]
    feature_names: tuple[str, ...]
    tail: Tail | None
    rates: tuple[float, ...]

    def predict_cdf(self, X: np.ndarray, num_threads: int = 1) -> np.ndarray:
        return np.repeat(monotone(np.asarray(self.rates))[None, :], len(X), axis=0)


def _replay_tracker(models: Mapping[str, Any], config: ReturnConfig, turns: list[TurnRecord], split: Split,
                    recalibration: Mapping[str, RecalibrationSpec] | None = None) -> dict[str, Any]:
    """Replays every arrival and turn end through one ReturnTracker per
    model and, every SNAPSHOT_S of the evaluated slice, scores the
    conditional forecasts: for each open conversation, did its next turn
    arrive within t of the snapshot (given it had not by then)? Windows past
    the data's end are dropped. Also times forecast_batch()."""
    H = config.horizons_s
    recalibration = recalibration or {}
    trackers = {name: ReturnTracker(m, config.features, config.tracker.max_open_conversations,
                                    config.tracker.max_idle_s, recalibration.get(name)) for name, m in models.items()}
    nxt = {(t.conversation, t.end_s): t.next_arrival_s for t in turns}
    events = sorted([(t.arrival_s, 0, t.conversation, t.turn_index, t) for t in turns]
                    + [(t.end_s, 1, t.conversation, t.turn_index, t) for t in turns], key=lambda e: e[:4])
    snaps = list(np.arange(split.eval_start_s, split.data_end_s, SNAPSHOT_S))
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {name: [] for name in models}
    open_counts, forecast_s = [], []
    for time_s, kind, conversation, _, turn in events + [(math.inf, 2, "", 0, None)]:
        while snaps and snaps[0] < time_s:
            now = snaps.pop(0)
            for name, tracker in trackers.items():
                began = time.perf_counter()
                batch = tracker.forecast_batch(now)
                forecast_s.append(time.perf_counter() - began)
                open_counts.append(len(batch.conversations))
                arrive = np.array([nxt[key] or math.inf for key in zip(batch.conversations, batch.end_s.tolist())])
                closes = now + np.asarray(H)[None, :]
                parts[name].append((batch.p_within, arrive[:, None] <= closes,
                                    np.broadcast_to(closes <= split.data_end_s, (len(arrive), len(H)))))
        for tracker in trackers.values():
            if kind == 0:
                tracker.arrival(conversation, time_s, turn.prompt_tokens)
            elif kind == 1:
                tracker.turn_end(conversation, time_s, turn.arrival_s, turn.prompt_tokens, turn.output_tokens,
                                 float(turn.follow_ups))
    scores = {}
    for name, chunks in parts.items():
        p, y, known = (np.concatenate([c[k] for c in chunks]) for k in range(3))
        scores[name] = {f"h{h:g}": evaluation.score(p[known[:, i], i], y[known[:, i], i]) for i, h in enumerate(H)}
    return {"snapshot_s": SNAPSHOT_S, "snapshots": len(open_counts) // max(len(models), 1),
            "mean_open_conversations": float(np.mean(open_counts)) if open_counts else 0.0,
            "forecast_batch_ms_mean": 1e3 * float(np.mean(forecast_s)) if forecast_s else math.nan,
            "conditional": scores}


def _target(score: Mapping[str, Any] | None) -> dict[str, Any]:
    if score is None:
        return {**TARGET, "auc_met": None, "ece_met": None}
    return {**TARGET, "auc_met": bool(score["auc"] >= TARGET["auc_min"]),
            "ece_met": bool(score["ece"] <= TARGET["ece_max"])}


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(type(value))


def _fmt(v: Any) -> str:
    return "   nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:6.3f}"


def _print_scores(models: Mapping[str, Mapping[str, Mapping[str, Any]]], horizons_s: list[float]) -> None:
    """One line per model and horizon: rows, base rate, mean p, AUC, Brier, ECE."""
    for name, per in models.items():
        for h in horizons_s:
            m = per[f"h{h:g}"]
            print(f"{name:<10}{h:>5g}{m['rows']:>7}{_fmt(m['base_rate']):>7}{_fmt(m['mean_p']):>7}"
                  f"{_fmt(m['auc']):>7}{_fmt(m['brier']):>7}{_fmt(m['ece']):>7}")


def _print(report: dict[str, Any]) -> None:
    print(f"\n{'model':<10}{'h s':>5}{'rows':>7}{'base':>7}{'mean p':>7}{'AUC':>7}{'Brier':>7}{'ECE':>7}")
    _print_scores(report["models"], report["horizons_s"])
    h = report["calibration_horizon_s"]
    print(f"\ncalibration at {h:g} s (10 equal-mass bins; mean p -> observed rate, rows)")
    for name, table in report["calibration"].items():
        cells = "  ".join(f"{b['mean_p']:.2f}->{b['observed']:.2f} ({b['rows']})" for b in table)
        print(f"{name:<10}{cells}")
    tr = report["tracker"]
    print(f"\ntracker replay (lightgbm, {RECAL} and the constant rates, all through the same tail): conditional "
          f"forecasts (not returned by the snapshot) every {tr['snapshot_s']:g} s of "
          f"the evaluated slice, {tr['mean_open_conversations']:.0f} open conversations on average, "
          f"forecast_batch() {tr['forecast_batch_ms_mean']:.1f} ms")
    _print_scores(tr["conditional"], report["horizons_s"])
    r = report["recalibration"]
    shifts = ", ".join(f"{v:+.3f}" for v in r["mean_shift_logit_evaluated"].values())
    print(f"\n{RECAL}: online level recalibration (window {r['window_s']:g} s, prior {r['prior_rows']:g} rows, "
          f"at most {r['max_shift_logit']:g} logit; enabled in the config: {r['enabled']}); mean logit shift per "
          f"horizon on the evaluated rows [{shifts}]")
    t = report["target"]
    print(f"target at {t['horizon_s']:g} s for {t['model']} (reported, not tuned to): AUC >= {t['auc_min']} met: "
          f"{t['auc_met']}; ECE <= {t['ece_max']} met: {t['ece_met']}")
    trees = [f["trees"] for f in report["training"]]
    valid_auc = ", ".join(f"{f['validation_auc']:.3f}" for f in report["training"])
    print(f"train_s {report['train_s']:.2f} (CPU {report['train_cpu_s']:.2f}; features for all rows "
          f"{report['features_s']:.2f} s), trees per horizon {trees}, validation-slice AUC per horizon [{valid_auc}]; "
          f"predict {report['predict_us_per_row_batch']:.1f}"
          f" us a row in a batch, {report['predict_us_single_row']:.0f} us for one row alone; 1-min load average "
          f"{report['load_average_1m']:.1f} on {os.cpu_count()} cores")
    print("note: " + QUANTISATION_NOTE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], {}))
