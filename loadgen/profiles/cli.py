"""`speckv profile fit`: an engine profile fitted to Vidur's published
per-operator measurements, with its error on held-out batch sizes.

    speckv profile fit --vidur-dir DIR --model meta-llama/Meta-Llama-3-8B --gpu a100
    speckv profile fit --vidur-dir DIR --model meta-llama/Meta-Llama-3-8B --gpu h100 \\
        --scale-from meta-llama/Llama-2-7b-hf          # not profiled there: scaled by shape
    speckv profile fit --vidur-dir DIR --model meta-llama/Llama-2-70b-hf --gpu h100 --tp 4

DIR is a microsoft/vidur checkout (or a copy of its data/ folder); speckv
never ships its files. What it fits (loadgen/profiles/fit.py):
- prefill: overhead_ms + ms_per_token * n on the non-attention forward pass
  (loadgen/profiles/vidur_csv.py: every layer's operators, tensor-parallel
  all-reduces, the embedding) over batch sizes >= --fit-min-tokens, plus the
  LM head once (the last token's logits: its weights read at the GPU's HBM
  bandwidth, which Vidur does not time) in overhead_ms;
- the attention pair term, from a published FlashAttention throughput for the
  GPU (--attention-tflops overrides it; Vidur's attention tables are too large
  for the stored copy and are not read);
- a decode step: step_ms + ms_per_seq * b for b sequences up to
  --decode-max-batch, the LM head read once per step, each sequence's KV reads
  apart (the emulated engine adds those from the HBM bandwidth).
Fit on alternate batch sizes, report the others. --json writes the profile
entry, ready for services/config/engine_profiles.json.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from speckv.loadgen.profiles.fit import HeldOutFit, attention_pair_ms, fit_held_out
from speckv.loadgen.profiles.vidur_csv import (
    AllReduceTimes,
    LayerTimes,
    forward_ms,
    gpu_ratio,
    read_all_reduce,
    read_layer_times,
)
from speckv.services.common.errors import InvalidArgument

VIDUR_REPOSITORY = "https://github.com/microsoft/vidur (MIT licence)"
REPORT_RANGE = (512, 16384)  # the batch sizes the held-out error is reported on
BANDS = ((512, 1023), (1024, 2047), (2048, 4095), (4096, 16384))
KV_DTYPE, KV_BYTES, BLOCK_SIZE = "bfloat16", 2, 16


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What the fit needs of a GPU beyond Vidur's tables, each with its source."""

    hardware: str
    hbm_gb_per_s: float
    hbm_source: str
    attention_tflops: float
    attention_source: str


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec(
        "NVIDIA H100 SXM 80GB", 3350.0, "NVIDIA H100 datasheet: H100 SXM HBM3, 3.35 TB/s",
        602.0, "FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608), Fig. 5, forward pass, BF16, causal mask, "
               "head dim 128, H100 80GB SXM5: 602 TFLOPs/s at sequence length 8k (521 at 2k, 579 at 4k, 616 "
               "at 16k). FlashAttention-2 reaches 333 TFLOPs/s in the same panel, which would make the pair "
               "term 1.8x larger."),
    "a100": GpuSpec(
        "NVIDIA A100 SXM 80GB", 2039.0, "NVIDIA A100 datasheet: A100 80GB SXM HBM2e, 2,039 GB/s",
        230.0, "FlashAttention-2 (Dao 2023, arXiv:2307.08691), section 4.1: the forward pass reaches up to 230 "
               "TFLOPs/s on an A100 80GB SXM4, 73 % of its 312 TFLOPs/s bf16 peak. That best case is measured "
               "without a causal mask, so this pair term is a lower bound (FlashAttention-3's Fig. 5 shows "
               "FlashAttention-2 with a causal mask at ~90 % of its throughput without one at 8k, on H100)."),
}
# num_hidden_layers of each model's config.json (Hugging Face model cards);
# Vidur's tables are per layer and do not record it. Then speckv's short name.
MODELS: dict[str, tuple[int, str]] = {
    "meta-llama/Meta-Llama-3-8B": (32, "llama-3-8b"),
    "meta-llama/Llama-2-7b-hf": (32, "llama-2-7b"),
    "meta-llama/Meta-Llama-3-70B": (80, "llama-3-70b"),
    "meta-llama/Llama-2-70b-hf": (80, "llama-2-70b"),
    "Qwen/Qwen-72B": (80, "qwen-72b"),
    "codellama/CodeLlama-34b-Instruct-hf": (48, "codellama-34b"),
    "internlm/internlm-20b": (60, "internlm-20b"),
    "microsoft/phi-2": (32, "phi-2"),
}


@dataclass(frozen=True, slots=True)
class ProfileFit:
    """Everything `speckv profile fit` found, in ms and tokens."""

    name: str
    model: str
    gpu: GpuSpec
    tensor_parallel: int
    times: LayerTimes
    num_layers: int
    scaling: str
    prefill: HeldOutFit
    decode: HeldOutFit
    lm_head_ms: float
    pair_ms: float
    attention_source: str
    all_reduce_file: str | None

    @property
    def overhead_ms(self) -> float:
        return max(0.0, self.prefill.fit.intercept_ms + self.lm_head_ms)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speckv profile", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fit = commands.add_parser("fit", help="fit an engine profile to Vidur's per-operator CSVs")
    fit.add_argument("--vidur-dir", type=Path, required=True, help="a microsoft/vidur checkout (its data/ folder)")
    fit.add_argument("--model", required=True, help="Vidur's model folder, e.g. meta-llama/Meta-Llama-3-8B")
    fit.add_argument("--gpu", required=True, choices=sorted(GPUS))
    fit.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per engine")
    fit.add_argument("--layers", type=int, default=0, help="the model's layers (default: known models' config)")
    fit.add_argument("--scale-from", default="", help="a model Vidur profiled on --gpu, when --model was not")
    fit.add_argument("--scale-by", choices=("shape", "gpu"), default="shape",
                     help="shape: --scale-from's times x the work ratio of each operator; gpu: --model's times "
                          "on --base-gpu x --scale-from's speed-up from --base-gpu to --gpu")
    fit.add_argument("--base-gpu", default="", help="where --model was profiled (default: the first found)")
    fit.add_argument("--fit-min-tokens", type=int, default=512, help="smallest prefill batch fitted")
    fit.add_argument("--decode-max-batch", type=int, default=128, help="largest decode batch fitted")
    fit.add_argument("--attention-tflops", type=float, default=0.0, help="override the GPU's published figure")
    fit.add_argument("--attention-source", default="", help="where --attention-tflops comes from (required with it)")
    fit.add_argument("--vidur-commit", default="", help="the checkout's commit, recorded in the profile")
    fit.add_argument("--name", default="", help="the profile's name (default: MODEL-GPU[-tpN]-vidur)")
    fit.add_argument("--json", type=Path, help="write the profile entry here")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parse(argv)
    fitted = fit_profile(args)
    print(render(fitted))
    if args.json:
        entry = {fitted.name: profile_entry(fitted, args, argv)}
        args.json.write_text(json.dumps(entry, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def fit_profile(args: argparse.Namespace) -> ProfileFit:
    if args.model not in MODELS and args.layers <= 0:
        raise InvalidArgument(f"--model {args.model!r} is not one speckv knows the layers of: pass --layers")
    if args.attention_tflops and not args.attention_source.strip():
        raise InvalidArgument("--attention-tflops needs --attention-source: every figure says where it comes from")
    if args.tp < 1 or args.fit_min_tokens < 1 or args.decode_max_batch < 2:
        raise InvalidArgument("--tp, --fit-min-tokens must be >= 1 and --decode-max-batch >= 2")
    num_layers = args.layers or MODELS[args.model][0]
    gpu = GPUS[args.gpu]
    times, scaling = _layer_times(args)
    all_reduce = _all_reduce(args) if args.tp > 1 else None
    total = forward_ms(times, num_layers, all_reduce)
    lm_head_ms = times.shape.vocab_size * times.shape.n_embd * KV_BYTES / (gpu.hbm_gb_per_s * 1e9 * args.tp) * 1e3
    largest = int(times.tokens[-1])
    report = (REPORT_RANGE[0], min(REPORT_RANGE[1], largest))
    bands = tuple((low, min(high, largest)) for low, high in BANDS if low < largest)
    prefill = fit_held_out(times.tokens, total, (args.fit_min_tokens, largest), report, bands)
    decode = fit_held_out(times.tokens, total + lm_head_ms, (1, args.decode_max_batch), (1, args.decode_max_batch))
    tflops = args.attention_tflops or gpu.attention_tflops
    source = args.attention_source.strip() or gpu.attention_source
    pair_ms = attention_pair_ms(num_layers, times.shape.n_head, times.shape.head_dim, tflops, args.tp)
    short = MODELS.get(args.model, (0, args.model.split("/")[-1].lower()))[1]
    name = args.name or f"{short}-{args.gpu}" + (f"-tp{args.tp}" if args.tp > 1 else "") + "-vidur"
    return ProfileFit(name, short, gpu, args.tp, times, num_layers, scaling, prefill, decode, lm_head_ms, pair_ms,
                      f"{tflops:g} TFLOPs/s per GPU: {source}", all_reduce.file if all_reduce else None)


def _mlp(args: argparse.Namespace, gpu: str, model: str) -> Path:
    return args.vidur_dir / "data" / "profiling" / "compute" / gpu / model / "mlp.csv"


def _layer_times(args: argparse.Namespace) -> tuple[LayerTimes, str]:
    direct = _mlp(args, args.gpu, args.model)
    if not args.scale_from:
        return read_layer_times(direct, args.tp), "none: measured on this GPU and model"
    reference = read_layer_times(_mlp(args, args.gpu, args.scale_from), args.tp)
    base_gpu = args.base_gpu or _first_gpu_with(args)
    target_there = read_layer_times(_mlp(args, base_gpu, args.model), args.tp)
    if args.scale_by == "shape":
        scaled = reference.scaled_to(target_there.shape, (str(_mlp(args, base_gpu, args.model)),))
        return scaled, (f"by shape: {args.scale_from} on {args.gpu}, each operator times the ratio of its work "
                        f"per token in {args.model} to that in {args.scale_from} (GEMM weight elements, element-wise "
                        f"vector widths; {args.model}'s shape from its {base_gpu} table)")
    reference_there = read_layer_times(_mlp(args, base_gpu, args.scale_from), args.tp)
    moved = gpu_ratio(target_there, reference, reference_there)
    return moved, (f"by GPU: {args.model} on {base_gpu}, each operator times {args.scale_from}'s speed-up from "
                   f"{base_gpu} to {args.gpu} at the same batch size (batch sizes all three tables share)")


def _first_gpu_with(args: argparse.Namespace) -> str:
    for gpu in sorted(GPUS):
        if gpu != args.gpu and _mlp(args, gpu, args.model).exists():
            return gpu
    raise InvalidArgument(f"{args.model} has no table under {args.vidur_dir / 'data/profiling/compute'}: scaling "
                          "needs its shape from one (or pass --base-gpu)")


def _all_reduce(args: argparse.Namespace) -> AllReduceTimes:
    path = args.vidur_dir / "data" / "profiling" / "network" / f"{args.gpu}_dgx" / "all_reduce.csv"
    return read_all_reduce(path, args.tp)


def _without_json(argv: Sequence[str]) -> list[str]:
    """argv less --json and its path: where a run wrote is not how to redo it."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--json":
            skip = True
        elif not arg.startswith("--json="):
            out.append(arg)
    return out


def render(fitted: ProfileFit) -> str:
    p, d = fitted.prefill, fitted.decode
    lines = [
        f"speckv profile fit: {fitted.name} ({fitted.model}, {fitted.tensor_parallel}x {fitted.gpu.hardware}, "
        f"{fitted.num_layers} layers)",
        f"  files:    {', '.join(fitted.times.files)}" + (f", {fitted.all_reduce_file}" if fitted.all_reduce_file
                                                          else ""),
        f"  scaling:  {fitted.scaling}",
        "",
        f"prefill (non-attention), fitted on {len(p.fit_sizes)} batch sizes in "
        f"[{int(p.fit_sizes[0])}, {int(p.fit_sizes[-1])}], {len(p.held_out_sizes)} held out:",
        f"  intercept   {p.fit.intercept_ms:9.3f} ms   + LM head {fitted.lm_head_ms:.3f} ms = overhead_ms "
        f"{fitted.overhead_ms:.3f}",
        f"  ms_per_token {p.fit.slope_ms:10.6f}      ({p.fit.slope_ms * 1e3:.2f} us per token)",
        f"  pair term   {fitted.pair_ms:.4g} ms per (query, key) pair ({fitted.attention_source.split(':')[0]})",
        "  held-out error     sizes    mean     p90      max  (at)",
    ]
    for e in (p.error, *p.bands):
        lines.append(f"    [{e.low:>5}, {e.high:>5}] {e.count:>6} {e.mean:7.1%} {e.p90:7.1%} {e.max:7.1%}  ({e.worst})")
    e = d.error
    lines += [
        "",
        f"decode step, fitted on {len(d.fit_sizes)} batch sizes in [1, {int(d.fit_sizes[-1])}] "
        f"(LM head included, KV reads not):",
        f"  step_ms {d.fit.intercept_ms:.3f} + ms_per_seq {d.fit.slope_ms:.5f} x sequences; held-out error mean "
        f"{e.mean:.1%}, max {e.max:.1%} (at {e.worst})",
    ]
    return "\n".join(lines)


def profile_entry(fitted: ProfileFit, args: argparse.Namespace, argv: Sequence[str]) -> dict:
    """The engine_profiles.json entry: the fitted figures and their provenance."""
    shape = fitted.times.shape
    root = str(args.vidur_dir)
    files = [f.removeprefix(root).lstrip("/") for f in fitted.times.files]
    if fitted.all_reduce_file:
        files.append(fitted.all_reduce_file.removeprefix(root).lstrip("/"))
    command = " ".join(["speckv profile"] + [shlex.quote("DIR" if a == root else a) for a in _without_json(argv)])
    p = fitted.prefill
    return {
        "model": fitted.model,
        "hardware": f"{fitted.tensor_parallel}x {fitted.gpu.hardware}, bf16"
                    + (f", tensor parallel {fitted.tensor_parallel}" if fitted.tensor_parallel > 1 else ""),
        "tensor_parallel": fitted.tensor_parallel,
        "overhead_ms": round(fitted.overhead_ms, 4),
        "ms_per_token": round(p.fit.slope_ms, 7),
        "ms_per_token_pair": float(f"{fitted.pair_ms:.4g}"),
        "geometry": {"num_layers": fitted.num_layers, "num_kv_heads": shape.n_kv_head, "head_dim": shape.head_dim,
                     "dtype": KV_DTYPE, "block_size": BLOCK_SIZE},
        "measured": True,
        "source": (f"Fitted by speckv profile fit to Vidur's published per-operator GPU timings "
                   f"({VIDUR_REPOSITORY}, commit {args.vidur_commit or 'unknown'}); provenance names the files, "
                   "the scaling, the held-out error and the attention source. overhead_ms = the fit's intercept + "
                   f"the LM head for the last token, its weights read at the HBM bandwidth ({fitted.gpu.hbm_source})"
                   "; CPU-side scheduling, sampling and kernel-launch gaps are in neither Vidur's tables nor this "
                   "profile."),
        "provenance": {
            "repository": VIDUR_REPOSITORY,
            "commit": args.vidur_commit or "unknown",
            "files": files,
            "command": command,
            "scaling": fitted.scaling,
            "fit": {"prefill_sizes": [int(p.fit_sizes[0]), int(p.fit_sizes[-1])], "fitted": len(p.fit_sizes),
                    "held_out": len(p.held_out_sizes), "intercept_ms": round(p.fit.intercept_ms, 4),
                    "lm_head_ms": round(fitted.lm_head_ms, 4)},
            "held_out_error": {**p.error.to_json(), "bands": [b.to_json() for b in p.bands]},
            "attention": fitted.attention_source,
        },
        "decode": {
            "step_ms": round(fitted.decode.fit.intercept_ms, 4),
            "ms_per_seq": round(fitted.decode.fit.slope_ms, 6),
            "batch_sizes": [1, int(fitted.decode.fit_sizes[-1])],
            "held_out_error": fitted.decode.error.to_json(),
            "note": "One decode step of b sequences = step_ms + ms_per_seq * b: every layer's operators, the "
                    "all-reduces and the LM head (read once per step); each sequence's KV reads come on top "
                    "(the emulated engine adds them from its HBM bandwidth).",
        },
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], {}))
