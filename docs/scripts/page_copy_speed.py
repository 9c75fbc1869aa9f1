"""A measurement, not a test: the connector's page copies (pages.py) against
memcpy in the same process, on the CPU (NumPy) and, where torch sees a CUDA
device, on device pages (torch's host<->device copies with the layout change),
beside a plain pinned-free host->device copy of the same bytes. Best of
--repeats; GB/s of KV moved. Prints a table and writes JSON.

    PYTHONPATH=$PWD/.shim .venv/bin/python docs/scripts/page_copy_speed.py [--blocks 256] [--json out.json]

The geometry is the bench's tiny Llama (4 layers, 4 KV heads, head_dim 64,
32-token blocks, float32) unless --layers/--heads/--head-dim/--block/--dtype say otherwise.
"""
from __future__ import annotations

import argparse
import json
from typing import Callable

import numpy as np
import torch

from speckv.loadgen.bench.transfer.tiers import best_gbps
from speckv.services.engine.vllm_connector.pages import (
    PageKind, gather_blocks, page_arrays, page_views, pages_to_pool, pool_to_pages)


def measure(device: str, args: argparse.Namespace) -> dict[str, float]:
    dtype = getattr(torch, args.dtype)
    kind = PageKind.CPU_HALVES if device == "cpu" else PageKind.CONTENT_HALVES
    engine_blocks = 2 * args.blocks + 8
    caches = [torch.randn(engine_blocks, args.heads, args.block, 2 * args.head_dim).to(dtype).to(device)
              for _ in range(args.layers)]
    pages = page_arrays(page_views(caches, args.heads, args.block, args.head_dim, kind))
    item = caches[0].element_size()
    pool = np.zeros((args.layers, 2, args.blocks + 4, args.block, args.heads, args.head_dim), dtype=f"u{item}")
    pool_pages, engine_pages = list(range(2, 2 + args.blocks)), list(range(5, 5 + args.blocks))
    nbytes = args.blocks * args.layers * 2 * args.block * args.heads * args.head_dim * item
    settle = (lambda: torch.cuda.synchronize()) if device != "cpu" else (lambda: None)
    source, target = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
    cases: dict[str, Callable[[], None]] = {
        "load (pool -> pages)": lambda: pool_to_pages(pages, pool, pool_pages, engine_pages),
        "save (pages -> pool)": lambda: pages_to_pool(pages, engine_pages, pool, pool_pages),
        "gather (pages -> canonical blocks)": lambda: gather_blocks(pages, engine_pages),
        "memcpy (host)": lambda: np.copyto(target, source),
    }
    if device != "cpu":
        staging = torch.empty(nbytes, dtype=torch.uint8, device=device)
        host = torch.from_numpy(source)
        cases["host -> device copy (contiguous)"] = lambda: staging.copy_(host)
    return {name: best_gbps(nbytes, run, args.repeats, settle) for name, run in cases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--blocks", 256), ("--layers", 4), ("--heads", 4), ("--head-dim", 64), ("--block", 32),
                          ("--repeats", 10)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = {device: measure(device, args) for device in devices}
    for device, figures in results.items():
        for name, gbps in figures.items():
            print(f"{device:5} {name:36} {gbps:7.2f} GB/s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "gbps": results}, out, indent=1)


if __name__ == "__main__":
    main()
