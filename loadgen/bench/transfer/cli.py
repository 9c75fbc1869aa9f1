"""`speckv bench transfer [--quick] [--json PATH]`: replication bandwidth of
the kvstore data plane against the ceilings measured in the same run.

Order of work:
  1. ceilings (NumPy memcpy, Python loopback socket with default options and
     with the data plane's; the better one is `ceilings.socket_gbps`, the
     denominator of every tcp ratio; for information the tuned socket whose
     receiver crc32c's every chunk, `socket_crc32c_gbps`) and component rates
     (NumPy pack / unpack of the reference kernels, crc32c, the chunk GMAC),
     GB/s = 1e9 B/s;
     on a machine with a CUDA device also the GPU copy / pack / unpack rates
     from speckv.kernels.bench.measure_gpu;
  2. two kvstore PROCESSES on loopback (`python -m speckv.services.cli
     kvstore`, llama-3-8b geometry: 2 MiB blocks), pools warmed by one
     untimed replication of the full volume per transport;
  3. for each transport (shm, tcp, nixl, grpc) and chunk size: PutBlocks a fresh set of
     hashes into the source (evicting the previous set, so pages are reused
     and warm; not timed), then time Replicate from the call until it returns
     committed; one sampled block is read back from the target and compared.
     GB/s = bytes replicated / that time, best of `repeats` (median kept too).
     Right after each setting's runs the tuned raw socket is measured again
     (`socket_adjacent_gbps`; ratio `..._over_adjacent_socket`): the machine
     is shared, so this pairs each number with a ceiling taken under the
     same load. The official ratios use the run's best ceiling. shm's
     ceiling is a NumPy memcpy of the same volume (`memcpy_adjacent_gbps`,
     ratio `..._over_adjacent_memcpy`; headline `shm_over_memcpy`). nixl's
     is NIXL's own WRITE of the same bytes between two bare agents
     (transfer/nixl_raw.py, `raw_nixl_adjacent_gbps`, also
     `ceilings.raw_nixl_gbps`; headline `nixl_over_raw_nixl`); nixl runs one
     chunk size (1 MiB): unpaced, an order is one NIXL transfer whatever
     the chunk.

  4. the data plane's protection (transfer/protect.py): replication with
     data_plane_auth on against off, alternating in the same run, and the
     ratio on / off (target >= 0.8; docs/security.md);

  4b. with --flood N, replication while N unauthenticated connections
     flood the target's data port, against idle (transfer/flood.py; target
     >= 0.8x idle, issue 43);

  4c. with `disk` among --transports, the disk tier's checked reads beside
     raw O_DIRECT reads of the same filesystem, same request size and depth
     (transfer/disk.py; ratio `disk_read_over_raw`, target >= 0.8; `disk`
     alone runs only this row);

  5. the kvstore's host<->device tier moves (transfer/tiers.py): demote
     and promote of scattered blocks through the store's PageMover, beside
     NumPy memcpy of the same bytes (on a GPU: beside a plain pinned
     host<->device copy).

Targets (docs/dataplane.md): tcp_over_socket >= 0.8 (chunks >= 1 MiB);
shm_over_memcpy >= 0.8; nixl_over_raw_nixl >= 0.9; NumPy
pack/unpack >= 0.5 x memcpy; GPU pack/unpack >= 0.7 x device copy; NumPy
demote/promote >= 0.5 x memcpy; CuPy demote/promote >= 0.7 x the plain copy.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from speckv.loadgen.bench.transfer import ceilings, disk, flood, nixl_raw
from speckv.loadgen.bench.transfer import protect
from speckv.loadgen.bench.transfer import tiers
from speckv.loadgen.bench.transfer.procs import KVStoreProcess, start_kvstore
from speckv.loadgen.bench.transfer.tls import tls_socket_gbps
from speckv.services.common.geometry import preset
from speckv.v1 import common_pb2, kvstore_pb2

KIB, MIB = 1 << 10, 1 << 20
TIMEOUT_S = 120.0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speckv bench transfer", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller volume and fewer repeats (< 1 min on 2 cores)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--geometry", default="llama-3-8b", help="KV geometry preset of both nodes")
    parser.add_argument("--mib", type=int, default=0, help="MiB per replication (default 256, quick 128)")
    parser.add_argument("--repeats", type=int, default=0, help="timed replications per setting (default 5, quick 2)")
    parser.add_argument("--chunks-kib", default="256,1024,4096", help="chunk sizes, KiB, comma-separated")
    parser.add_argument("--transports", default="shm,tcp,grpc",
                        help="data planes to measure: shm (same-host shared memory), tcp, nixl (if installed), grpc; "
                             "disk: the disk tier's reads beside raw reads of the same filesystem (transfer/disk.py; "
                             "alone, only that row runs)")
    parser.add_argument("--disk-dir", type=Path, help="where the disk row's files go (default: the temp dir)")
    parser.add_argument("--disk-request-kib", type=int, default=1024, help="disk row: read request size, KiB")
    parser.add_argument("--disk-depth", type=int, default=4, help="disk row: requests in flight (threads)")
    parser.add_argument("--no-protection", action="store_true",
                        help="skip the data_plane_auth on/off comparison")
    parser.add_argument("--flood", type=int, default=0,
                        help="also replicate while this many unauthenticated connections flood the target's data "
                             "port (transfer/flood.py); 0: skip")
    parser.add_argument("--flood-sources", type=int, default=1, help="loopback addresses the flood comes from")
    parser.add_argument("--flood-s", type=float, default=60.0, help="seconds the flood lasts at least")
    parser.add_argument("--flood-only", action="store_true", help="run the flood comparison alone")
    parser.add_argument("--flood-pin", action="store_true",
                        help="kvstores on CPU 0, the flood on the others (its own CPU out of the figure)")
    parser.add_argument("--flood-paced", action="store_true",
                        help="a connection the node closes is re-opened at its next 0.25 s tick, not at once")
    return parser.parse_args(argv)


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    args = parse(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    volume = (args.mib or (128 if args.quick else 256)) * MIB
    geometry = preset(args.geometry)
    blocks = max(1, volume // geometry.bytes_per_block)
    results: dict[str, Any] = {"geometry": geometry.name, "bytes_per_block": geometry.bytes_per_block,
                               "blocks_per_replication": blocks, "repeats": repeats, "quick": args.quick}
    started = time.perf_counter()
    if args.flood_only:
        return _flood_only(args, geometry, blocks, repeats, results, started, environ)
    transports = [t for t in args.transports.split(",") if t]
    if "disk" in transports:
        results["disk"] = measure_disk(args, geometry, volume, max(3, repeats))
        transports.remove("disk")
        if not transports:
            return _finish(args, results, {"disk_read_over_raw": results["disk"]["disk_read_over_raw"]}, started)
    results.update(measure_ceilings(geometry, quick=args.quick, repeats=max(3, repeats)))
    show_ceilings(results)
    results["tier_moves"] = tiers.tier_moves(geometry, max(1, volume // 2 // geometry.bytes_per_block),
                                             max(3, repeats))
    show_tier_moves(results["tier_moves"])
    chunk_sizes = [int(c) * KIB for c in args.chunks_kib.split(",") if c]
    if "nixl" in transports and not nixl_raw.available():
        print("nixl: NIXL is not installed here (make .venv/.installed-nixl); no nixl row")
        transports.remove("nixl")
    results["replication"] = measure_replication(geometry, blocks, chunk_sizes, transports, repeats, environ)
    raw_nixl = [r["raw_nixl_adjacent_gbps"] for r in results["replication"] if r["transport"] == "nixl"]
    if raw_nixl:
        results["ceilings"]["raw_nixl_gbps"] = max(raw_nixl)
    if not args.no_protection:
        results["protection"] = measure_protection(geometry, blocks, max(3, repeats), environ)
    if args.flood:
        results["flood"] = measure_flood(args, geometry, blocks, repeats, environ)
    return _finish(args, results, ratios(results), started)


def _finish(args: argparse.Namespace, results: dict[str, Any], figures: dict[str, float], started: float) -> int:
    results["ratios"] = figures
    results["seconds"] = round(time.perf_counter() - started, 1)
    for key, value in results["ratios"].items():
        print(f"  {key:<40} {value:6.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def measure_disk(args: argparse.Namespace, geometry, volume: int, repeats: int) -> dict[str, Any]:
    row = disk.disk_reads(geometry, volume, args.disk_request_kib * KIB, args.disk_depth, repeats, args.disk_dir)
    print(f"disk ({row['filesystem']}, {'O_DIRECT' if row['direct'] else 'buffered'}, {row['records']} records of "
          f"{row['record_bytes']} B, requests {row['request_bytes'] // KIB} KiB x {row['depth']} in flight): "
          f"disk {row['disk_read_gbps']:6.2f} GB/s, raw {row['raw_read_gbps']:6.2f} GB/s (medians "
          f"{row['disk_read_median_gbps']:.2f} / {row['raw_read_median_gbps']:.2f})")
    return row


def measure_ceilings(geometry, *, quick: bool, repeats: int) -> dict[str, Any]:
    size = (128 if quick else 256) * MIB
    pack_blocks = max(1, size // 2 // geometry.bytes_per_block)
    pack, unpack = ceilings.pack_unpack_gbps(geometry, pack_blocks, repeats)
    default = ceilings.socket_gbps(2 * size, repeats)
    tuned = ceilings.socket_gbps(2 * size, repeats, tuned=True)
    tls = tls_socket_gbps(2 * size, repeats)  # the TLS data plane's ceiling (prototype; docs/security.md)
    checked = ceilings.socket_gbps(2 * size, repeats, tuned=True, checksum=True)
    out: dict[str, Any] = {
        "ceilings": {"memcpy_gbps": ceilings.memcpy_gbps(pack_blocks * geometry.bytes_per_block, repeats),
                     "socket_gbps": max(default, tuned), "socket_default_gbps": default,
                     "socket_tuned_gbps": tuned, "tls_socket_gbps": tls, "socket_crc32c_gbps": checked},
        "pack_gbps": pack, "unpack_gbps": unpack,
        "crc32c_gbps": ceilings.crc32c_gbps(4 * MIB, 20),
        "gmac_gbps": ceilings.gmac_gbps(4 * MIB, 20),
    }
    out.update(gpu_fields(geometry))
    return out


def gpu_fields(geometry) -> dict[str, Any]:
    """GPU numbers from the kernels' own benchmark when a device is present:
    ceilings.device_copy_gbps, gpu_pack_gbps, gpu_unpack_gbps (+ details)."""
    try:
        from speckv.kernels.backend import cuda_available
        from speckv.kernels.bench import measure_gpu
    except ImportError as exc:
        return {"gpu": {"available": False, "reason": f"kernels benchmark not importable: {exc}"}}
    if not cuda_available():
        return {"gpu": {"available": False, "reason": "no CUDA device"}}
    measured = measure_gpu(geometry)
    return {"gpu": {"available": True, **measured},
            "gpu_pack_gbps": measured["gpu_pack_gbps"], "gpu_unpack_gbps": measured["gpu_unpack_gbps"],
            "ceilings_device_copy_gbps": measured["device_copy_gbps"]}


def show_ceilings(results: dict[str, Any]) -> None:
    device_copy = results.pop("ceilings_device_copy_gbps", None)
    if device_copy is not None:
        results["ceilings"]["device_copy_gbps"] = device_copy
    for key, value in results["ceilings"].items():
        print(f"ceiling {key:<24} {value:8.2f} GB/s")
    for key in ("pack_gbps", "unpack_gbps", "crc32c_gbps", "gmac_gbps", "gpu_pack_gbps", "gpu_unpack_gbps"):
        if key in results:
            print(f"        {key:<24} {results[key]:8.2f} GB/s")


def show_tier_moves(moves: dict[str, Any]) -> None:
    for where, figures in moves.items():
        line = ", ".join(f"{k} {v:.2f}" for k, v in figures.items())
        print(f"tier moves ({where}): {line}")


def _kvstore_args(geometry, blocks: int) -> list[str]:
    return ["--geometry", geometry.name, "--device-pages", str(blocks + 4), "--max-message-mb", "16",
            "--reservation-lease-s", "60", "--peer-timeout-s", "60"]


def measure_protection(geometry, blocks: int, repeats: int, environ: Mapping[str, str]) -> dict[str, Any]:
    row = protect.protection(_kvstore_args(geometry, blocks), 1024 * KIB, repeats, environ,
                             lambda source, target: _Bench(source, target, geometry, blocks).replicate)
    print(f"protection tcp chunk 1024 KiB  off {row['off_gbps']:6.2f} GB/s, on {row['on_gbps']:6.2f} GB/s "
          f"(medians {row['off_median_gbps']:.2f} / {row['on_median_gbps']:.2f}): on / off {row['ratio']:.2f} "
          f"(median {row['ratio_median']:.2f})")
    return row


def measure_flood(args: argparse.Namespace, geometry, blocks: int, repeats: int,
                  environ: Mapping[str, str]) -> dict[str, Any]:
    row = flood.flooded(_kvstore_args(geometry, blocks), 1024 * KIB, repeats, environ,
                        lambda source, target: _Bench(source, target, geometry, blocks).replicate,
                        connections=args.flood, sources=args.flood_sources, flood_s=args.flood_s,
                        pin=args.flood_pin, eager=not args.flood_paced)
    print(f"flood tcp chunk 1024 KiB  idle {row['idle_median_gbps']:6.2f} GB/s, with {row['connections']} "
          f"unauthenticated connections from {row['sources']} address(es) {row['flooded_median_gbps']:6.2f} GB/s "
          f"(medians; {len(row['flooded_runs_gbps'])} flooded runs over {row['flood_seconds']} s, "
          f"{row['flood_opened']} connections opened{', pinned' if row['pinned'] else ''}"
          f"{'' if row['eager'] else ', paced'}): flooded / idle "
          f"{row['ratio_median']:.2f}")
    return row


def _flood_only(args: argparse.Namespace, geometry, blocks: int, repeats: int, results: dict[str, Any],
                started: float, environ: Mapping[str, str]) -> int:
    results["flood"] = measure_flood(args, geometry, blocks, repeats, environ)
    results["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def measure_replication(geometry, blocks: int, chunk_sizes: list[int], transports: list[str], repeats: int,
                        environ: Mapping[str, str]) -> list[dict[str, Any]]:
    args = [*_kvstore_args(geometry, blocks), *(["--nixl"] if "nixl" in transports else [])]
    source = start_kvstore("bench-src", args, environ=environ)
    target = link = None
    try:
        target = start_kvstore("bench-dst", args, environ=environ)
        link = ceilings.SocketCeiling(blocks * geometry.bytes_per_block, tuned=True)
        bench = _Bench(source, target, geometry, blocks)
        rows = []
        for transport in transports:
            bench.replicate(transport, 1024 * KIB)  # warm-up: touches every page of both pools
            for chunk in ([1024 * KIB] if transport == "nixl" else chunk_sizes):
                runs = [bench.replicate(transport, chunk) for _ in range(repeats)]
                # shm's ceiling is a memcpy of the same bytes; nixl's NIXL's own write of them; the others' the socket
                ceiling = {"shm": "memcpy", "nixl": "raw_nixl"}.get(transport, "socket")
                adjacent = (ceilings.memcpy_gbps(blocks * geometry.bytes_per_block, repeats) if ceiling == "memcpy"
                            else nixl_raw.raw_nixl_gbps(blocks * geometry.bytes_per_block, repeats)
                            if ceiling == "raw_nixl" else link.gbps(repeats))
                row = {"transport": transport, "chunk_bytes": chunk, "gbps": max(runs),
                       "gbps_median": statistics.median(runs), "runs_gbps": runs,
                       "bytes": blocks * geometry.bytes_per_block, f"{ceiling}_adjacent_gbps": adjacent}
                print(f"replication {transport:<5} chunk {chunk // KIB:>5} KiB  {row['gbps']:6.2f} GB/s "
                      f"(median {row['gbps_median']:.2f}; raw {ceiling} just after: {adjacent:.2f})")
                rows.append(row)
        return rows
    finally:
        if link is not None:
            link.close()
        for process in (source, target):
            if process is not None:
                process.stop()


class _Bench:
    """Fresh hashes per replication; the same random bytes in every block."""

    def __init__(self, source: KVStoreProcess, target: KVStoreProcess, geometry, blocks: int) -> None:
        self.source, self.target = source, target
        self.blocks = blocks
        self.payload = np.random.default_rng(7).integers(0, 256, geometry.bytes_per_block, dtype=np.uint8).tobytes()
        self.bytes = blocks * geometry.bytes_per_block
        self._next_hash = 1_000_000
        self._orders = 0

    def _fresh(self) -> list[int]:
        hashes = list(range(self._next_hash, self._next_hash + self.blocks))
        self._next_hash += self.blocks
        messages = (kvstore_pb2.PutBlockRequest(block_hash=h, data=self.payload, family="bench") for h in hashes)
        reply = self.source.stub.PutBlocks(messages, timeout=TIMEOUT_S)
        if reply.stored != len(hashes):
            raise RuntimeError(f"source stored {reply.stored} of {len(hashes)} blocks")
        return hashes

    def replicate(self, transport: str, chunk_bytes: int) -> float:
        hashes = self._fresh()
        self._orders += 1
        order = common_pb2.ReplicationOrder(
            order_id=f"bench-{self._orders}", block_hashes=hashes, source_node=self.source.node_id,
            target_node=self.target.node_id, target_address=self.target.address, family="bench")
        request = kvstore_pb2.ReplicateRequest(order=order, chunk_bytes=chunk_bytes, transport=transport)
        started = time.perf_counter()
        reply = self.source.stub.Replicate(request, timeout=TIMEOUT_S)
        seconds = time.perf_counter() - started
        if reply.state != common_pb2.ORDER_STATE_COMMITTED or reply.blocks_sent != len(hashes):
            raise RuntimeError(f"replication {order.order_id} did not commit every block: {reply}")
        if reply.transport != transport:
            raise RuntimeError(f"asked for transport {transport}, the source used {reply.transport!r}")
        sample = hashes[len(hashes) // 2]
        block = next(iter(self.target.stub.GetBlocks(kvstore_pb2.GetBlocksRequest(block_hashes=[sample]),
                                                     timeout=TIMEOUT_S)))
        if block.data != self.payload:
            raise RuntimeError(f"block {sample} on the target differs from the source's")
        return self.bytes / seconds / 1e9


def headline_ratios(results: dict[str, Any]) -> dict[str, float]:
    """The data plane's targets (docs/dataplane.md): tcp_over_socket, the best
    tcp row of 1 MiB+ chunks over the socket ceiling; shm_over_memcpy, the
    best shm row over memcpy (both ceilings of the same run)."""
    c, out = results["ceilings"], {}
    rows = results.get("replication", [])
    tcp = [r["gbps"] for r in rows if r["transport"] == "tcp" and r["chunk_bytes"] >= MIB]
    shm = [r["gbps"] for r in rows if r["transport"] == "shm"]
    nixl = [r for r in rows if r["transport"] == "nixl"]
    if nixl:
        best = max(nixl, key=lambda r: r["gbps"])
        out["nixl_over_raw_nixl"] = best["gbps"] / c["raw_nixl_gbps"]
    if tcp:
        out["tcp_over_socket"] = max(tcp) / c["socket_gbps"]
    if shm:
        out["shm_over_memcpy"] = max(shm) / c["memcpy_gbps"]
    return out


def ratios(results: dict[str, Any]) -> dict[str, float]:
    c = results["ceilings"]
    out = {"pack_over_memcpy": results["pack_gbps"] / c["memcpy_gbps"],
           "tls_socket_over_socket": c["tls_socket_gbps"] / c["socket_gbps"],
           "socket_crc32c_over_socket": c["socket_crc32c_gbps"] / c["socket_gbps"],
           "unpack_over_memcpy": results["unpack_gbps"] / c["memcpy_gbps"]}
    for row in results.get("replication", []):
        name = f"{row['transport']}_{row['chunk_bytes'] // KIB}k"
        if row["transport"] == "shm":
            out[f"{name}_over_memcpy"] = row["gbps"] / c["memcpy_gbps"]
            out[f"{name}_over_adjacent_memcpy"] = row["gbps"] / row["memcpy_adjacent_gbps"]
            continue
        if row["transport"] == "nixl":
            out[f"{name}_over_raw_nixl"] = row["gbps"] / row["raw_nixl_adjacent_gbps"]
            continue
        out[f"{name}_over_socket"] = row["gbps"] / c["socket_gbps"]
        out[f"{name}_over_adjacent_socket"] = row["gbps"] / row["socket_adjacent_gbps"]
    out.update(headline_ratios(results))
    if "disk" in results:
        out["disk_read_over_raw"] = results["disk"]["disk_read_over_raw"]
    if "flood" in results:
        out["flooded_over_idle_median"] = results["flood"]["ratio_median"]
    if "protection" in results:
        out["protected_over_unprotected"] = results["protection"]["ratio"]
        out["protected_over_unprotected_median"] = results["protection"]["ratio_median"]
    if "device_copy_gbps" in c:
        out["gpu_pack_over_device_copy"] = results["gpu_pack_gbps"] / c["device_copy_gbps"]
        out["gpu_unpack_over_device_copy"] = results["gpu_unpack_gbps"] / c["device_copy_gbps"]
    for where, figures in results.get("tier_moves", {}).items():
        for key, value in figures.items():
            if "_over_" in key:
                out[f"{where}_{key}"] = value
    return out
