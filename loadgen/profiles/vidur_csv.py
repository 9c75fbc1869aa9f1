"""Vidur's published per-operator profiles, read into arrays.

Vidur (microsoft/vidur, MLSys 2024, MIT licence) times every non-attention
operator of one transformer layer with CUDA events for batches of 1 to 4k
(32k for some models) tokens, per GPU and tensor-parallel degree:

    data/profiling/compute/<gpu>/<org>/<model>/mlp.csv
        time_stats.<op>.median (ms, one layer, one GPU), num_tokens,
        num_tensor_parallel_workers, and the model's shape (n_head, n_kv_head,
        n_embd, n_expanded_embd, vocab_size, use_gated_mlp)
    data/profiling/network/<gpu>_dgx/all_reduce.csv
        time_stats.all_reduce.median (ms), size (bytes), num_workers,
        devices_per_node, collective

The files are read from a directory the user points at and never shipped
with speckv. A missing file, column or unreadable value is an InvalidArgument
naming the file and line (line 1 is the header). Several rows for one batch
size (Vidur repeats some) are merged by their median.

Scaling, for a model or GPU Vidur did not profile:
- by shape (`scaled_to`): each operator's time is multiplied by the ratio of
  the work it does per token in the two models (a GEMM's weight elements, an
  element-wise operator's vector width), on the same GPU;
- by GPU (`gpu_ratio`): each operator's time is multiplied by how much faster
  another model's same operator runs on the target GPU, at the same batch size.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from speckv.services.common.errors import InvalidArgument

# The operators of one layer that Vidur's execution-time model adds up besides
# attention (vidur/entities/execution_time.py: the attention and MLP layers'
# projections, rope, norms, activation, residual add).
LAYER_OPERATORS = ("attn_pre_proj", "attn_rope", "attn_post_proj", "input_layernorm",
                   "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
EMBEDDING = "emb"  # once per forward pass, not per layer
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The widths Vidur records for a model; head_dim = n_embd / n_head."""

    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    vocab_size: int
    gated_mlp: bool

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def work_per_token(self, operator: str) -> float:
        """What `operator` does per token, in elements (of weights for a GEMM,
        of the vector for an element-wise operator), for the whole model width:
        tensor parallelism divides every sharded one alike, so ratios between
        two models at the same degree do not depend on it."""
        q_kv = (self.n_head + 2 * self.n_kv_head) * self.head_dim
        widths = {
            "attn_pre_proj": self.n_embd * q_kv,
            "attn_post_proj": self.n_embd * self.n_embd,
            "attn_rope": (self.n_head + self.n_kv_head) * self.head_dim,
            "mlp_up_proj": self.n_embd * self.n_expanded_embd * (2 if self.gated_mlp else 1),
            "mlp_act": self.n_expanded_embd,
            "mlp_down_proj": self.n_expanded_embd * self.n_embd,
            "input_layernorm": self.n_embd,
            "post_attention_layernorm": self.n_embd,
            "add": self.n_embd,
            EMBEDDING: self.n_embd,
        }
        return float(widths[operator])


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One model's operator times on one GPU at one tensor-parallel degree.

    tokens: batch sizes, ascending, unique. ops: per operator of
    LAYER_OPERATORS and EMBEDDING, ms (median) at each batch size, aligned
    with tokens. files: where the figures come from (several after scaling).
    """

    shape: ModelShape
    tensor_parallel: int
    tokens: np.ndarray
    ops: dict[str, np.ndarray]
    files: tuple[str, ...] = field(default_factory=tuple)

    def layer_ms(self) -> np.ndarray:
        """One layer's non-attention time at each batch size, ms."""
        return np.sum([self.ops[op] for op in LAYER_OPERATORS], axis=0)

    def at(self, tokens: np.ndarray) -> "LayerTimes":
        """The same profile restricted to `tokens` (each must be present)."""
        index = np.searchsorted(self.tokens, tokens)
        found = self.tokens[np.minimum(index, len(self.tokens) - 1)] == tokens
        if not np.all(found):
            raise InvalidArgument(f"batch sizes {np.asarray(tokens)[~found][:5].tolist()} are not in the profile")
        return LayerTimes(self.shape, self.tensor_parallel, np.asarray(tokens),
                          {op: times[index] for op, times in self.ops.items()}, self.files)

    def scaled_to(self, shape: ModelShape, files: tuple[str, ...] = ()) -> "LayerTimes":
        """These times, scaled operator by operator to a model of `shape`."""
        ops = {op: times * (shape.work_per_token(op) / self.shape.work_per_token(op))
               for op, times in self.ops.items()}
        return LayerTimes(shape, self.tensor_parallel, self.tokens, ops, self.files + files)


def gpu_ratio(target: LayerTimes, reference_here: LayerTimes, reference_there: LayerTimes) -> LayerTimes:
    """`target` (measured on another GPU) moved to this GPU: each operator
    times reference_here / reference_there, a second model's same operator on
    this GPU and on the other, at the batch sizes all three share."""
    common = np.intersect1d(np.intersect1d(target.tokens, reference_here.tokens), reference_there.tokens)
    if len(common) == 0:
        raise InvalidArgument("the three profiles share no batch size")
    t, here, there = target.at(common), reference_here.at(common), reference_there.at(common)
    ops = {op: t.ops[op] * here.ops[op] / there.ops[op] for op in t.ops}
    return LayerTimes(target.shape, target.tensor_parallel, common, ops,
                      target.files + reference_here.files + reference_there.files)


def read_layer_times(path: Path, tensor_parallel: int = 1) -> LayerTimes:
    """Vidur's mlp.csv for one model on one GPU, at one tensor-parallel degree."""
    header, rows = _read(path)
    columns = [f"time_stats.{op}.median" for op in (*LAYER_OPERATORS, EMBEDDING)]
    _require_columns(path, header, [*columns, "num_tokens", "num_tensor_parallel_workers", *SHAPE_COLUMNS])
    by_tokens: dict[int, list[list[float]]] = {}
    shape: ModelShape | None = None
    degrees: set[int] = set()
    for line, row in rows:
        degree = _int(path, line, row, "num_tensor_parallel_workers")
        degrees.add(degree)
        if degree != tensor_parallel:
            continue
        row_shape = _shape(path, line, row)
        if shape is not None and row_shape != shape:
            raise InvalidArgument(f"{path}:{line}: model shape {row_shape} differs from earlier rows' {shape}")
        shape = row_shape
        tokens = _int(path, line, row, "num_tokens")
        if tokens <= 0:
            raise InvalidArgument(f"{path}:{line}: num_tokens={tokens} must be > 0")
        by_tokens.setdefault(tokens, []).append([_float(path, line, row, c) for c in columns])
    if shape is None:
        raise InvalidArgument(f"{path}: no rows with num_tensor_parallel_workers={tensor_parallel} "
                              f"(the file has {', '.join(map(str, sorted(degrees))) or 'no rows'})")
    tokens_sorted = sorted(by_tokens)
    medians = np.array([np.median(np.array(by_tokens[t]), axis=0) for t in tokens_sorted])
    ops = {op: medians[:, i] for i, op in enumerate((*LAYER_OPERATORS, EMBEDDING))}
    return LayerTimes(shape, tensor_parallel, np.array(tokens_sorted, dtype=np.int64), ops, (str(path),))


@dataclass(frozen=True, slots=True)
class AllReduceTimes:
    """One all-reduce among `workers` GPUs of one server: ms (median) by
    message size in bytes, ascending."""

    workers: int
    sizes: np.ndarray
    ms: np.ndarray
    file: str

    def at_bytes(self, nbytes: np.ndarray) -> np.ndarray:
        """ms for messages of `nbytes`: interpolated linearly between the
        measured sizes; beyond the largest, in proportion to the bytes, as a
        bandwidth-bound collective grows."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        inside = np.interp(nbytes, self.sizes, self.ms)
        beyond = self.ms[-1] * nbytes / self.sizes[-1]
        return np.where(nbytes > self.sizes[-1], beyond, inside)


def read_all_reduce(path: Path, workers: int) -> AllReduceTimes:
    """Vidur's all_reduce.csv: the rows of `workers` GPUs on one server."""
    header, rows = _read(path)
    _require_columns(path, header, ["time_stats.all_reduce.median", "size", "num_workers", "devices_per_node",
                                    "collective"])
    by_size: dict[int, list[float]] = {}
    for line, row in rows:
        if row.get("collective") != "all_reduce":
            continue
        if _int(path, line, row, "num_workers") != workers or _int(path, line, row, "devices_per_node") != workers:
            continue
        size = _int(path, line, row, "size")
        by_size.setdefault(size, []).append(_float(path, line, row, "time_stats.all_reduce.median"))
    if not by_size:
        raise InvalidArgument(f"{path}: no all_reduce rows with num_workers = devices_per_node = {workers}")
    sizes = sorted(by_size)
    return AllReduceTimes(workers, np.array(sizes, dtype=np.float64),
                          np.array([float(np.median(by_size[s])) for s in sizes]), str(path))


def _read(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = list(reader.fieldnames or [])
            rows = [(reader.line_num, row) for row in reader]
    except FileNotFoundError:
        raise InvalidArgument(f"{path}: no such file (is --vidur-dir the root of a microsoft/vidur checkout, "
                              "with its data/profiling files present rather than Git LFS pointers?)") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidArgument(f"{path}: unreadable ({exc})") from None
    if not header:
        raise InvalidArgument(f"{path}:1: empty file, expected a CSV header")
    if header[0].startswith("version https://git-lfs"):
        raise InvalidArgument(f"{path}:1: a Git LFS pointer, not the data: fetch the file's contents")
    return header, rows


def _require_columns(path: Path, header: list[str], columns: list[str]) -> None:
    missing = [c for c in columns if c not in header]
    if missing:
        raise InvalidArgument(f"{path}:1: missing column(s) {', '.join(missing)}")


def _float(path: Path, line: int, row: dict[str, str], column: str) -> float:
    text = row.get(column)
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidArgument(f"{path}:{line}: column {column}: {text!r} is not a number") from None
    if not np.isfinite(value) or value < 0:
        raise InvalidArgument(f"{path}:{line}: column {column}: {text!r} is not a finite time >= 0")
    return value


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    text = row.get(column)
    try:
        return int(float(text))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(f"{path}:{line}: column {column}: {text!r} is not an integer") from None


def _shape(path: Path, line: int, row: dict[str, str]) -> ModelShape:
    gated = str(row.get("use_gated_mlp", "")).strip().lower()
    if gated not in ("true", "false"):
        raise InvalidArgument(f"{path}:{line}: column use_gated_mlp: {gated!r} is not True or False")
    shape = ModelShape(_int(path, line, row, "n_head"), _int(path, line, row, "n_kv_head"),
                       _int(path, line, row, "n_embd"), _int(path, line, row, "n_expanded_embd"),
                       _int(path, line, row, "vocab_size"), gated == "true")
    if min(shape.n_head, shape.n_kv_head, shape.n_embd, shape.n_expanded_embd) <= 0:
        raise InvalidArgument(f"{path}:{line}: the model shape columns must be > 0")
    return shape


def forward_ms(times: LayerTimes, num_layers: int, all_reduce: AllReduceTimes | None = None,
               bytes_per_activation: int = 2) -> np.ndarray:
    """One forward pass's non-attention time at each of times.tokens, ms, as
    Vidur's execution-time model adds it up: num_layers x the layer's
    operators, plus (tensor parallelism) two all-reduces per layer of the
    batch's activations (tokens x n_embd x bytes_per_activation), plus the
    embedding lookup once. Attention kernels and the LM head are not in it."""
    total = num_layers * times.layer_ms() + times.ops[EMBEDDING]
    if times.tensor_parallel > 1:
        if all_reduce is None or all_reduce.workers != times.tensor_parallel:
            raise InvalidArgument(f"tensor parallelism {times.tensor_parallel} needs the all-reduce times of "
                                  f"{times.tensor_parallel} GPUs")
        nbytes = times.tokens * times.shape.n_embd * bytes_per_activation
        total = total + 2 * num_layers * all_reduce.at_bytes(nbytes)
    return np.asarray(total, dtype=np.float64)
