"""Small Vidur-format tables (mlp.csv, all_reduce.csv) with known times, for
the profile-fit tests. Times are linear in the batch size, so a fit must
recover them exactly."""
from __future__ import annotations

import csv
from pathlib import Path

from speckv.loadgen.profiles.vidur_csv import EMBEDDING, LAYER_OPERATORS

SHAPE = {"n_head": 4, "n_kv_head": 2, "n_embd": 256, "n_expanded_embd": 512, "vocab_size": 1000,
         "use_gated_mlp": "True"}
# Per operator: (ms at 0 tokens, ms per token), one layer.
OP_COSTS = {op: (0.01 * (i + 1), 0.001 * (i + 1)) for i, op in enumerate((*LAYER_OPERATORS, EMBEDDING))}


def layer_intercept_ms() -> float:
    return sum(OP_COSTS[op][0] for op in LAYER_OPERATORS)


def layer_slope_ms() -> float:
    return sum(OP_COSTS[op][1] for op in LAYER_OPERATORS)


def mlp_header() -> list[str]:
    columns = [f"time_stats.{op}.{stat}" for op in (EMBEDDING, *LAYER_OPERATORS)
               for stat in ("min", "max", "mean", "median", "std")]
    return columns + list(SHAPE) + ["num_tokens", "num_tensor_parallel_workers"]


def mlp_row(tokens: int, tp: int = 1, scale: float = 1.0, shape: dict | None = None) -> dict[str, object]:
    row: dict[str, object] = {}
    for op in (EMBEDDING, *LAYER_OPERATORS):
        base, per_token = OP_COSTS[op]
        value = scale * (base + per_token * tokens)
        row.update({f"time_stats.{op}.{stat}": value for stat in ("min", "max", "mean", "median")})
        row[f"time_stats.{op}.std"] = 0.0
    row.update(shape or SHAPE)
    row.update({"num_tokens": tokens, "num_tensor_parallel_workers": tp})
    return row


def write_mlp(path: Path, rows: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=mlp_header())
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_all_reduce(path: Path, workers: int, ms_at: dict[int, float]) -> Path:
    """Rows for `workers` GPUs (and a decoy for another count) at each size (bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ["", "time_stats.all_reduce.min", "time_stats.all_reduce.max", "time_stats.all_reduce.mean",
              "time_stats.all_reduce.median", "time_stats.all_reduce.std", "rank", "num_workers", "size",
              "collective", "devices_per_node", "max_devices_per_node"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for i, (size, ms) in enumerate(sorted(ms_at.items())):
            writer.writerow([i, ms, ms, ms, ms, 0.0, 0, workers, size, "all_reduce", workers, 8])
            writer.writerow([i, 99.0, 99.0, 99.0, 99.0, 0.0, 0, workers * 2, size, "all_reduce", workers * 2, 8])
    return path
