"""`speckv cost`: which regime a cluster is in. For an engine profile and a
link profile, the price per token of recomputing a prompt's KV, promoting it
from the node's host tier, loading it from the node's disk tier and pulling
it from a peer, and the prompt lengths where each is cheapest
(services/common/cost_table.py has the model).

    speckv cost --profile llama-3-8b-h100-vidur --link tcp-25g
    speckv cost --profile llama-2-70b-h100-tp4-vidur --link rdma-400g --json out/cost.json

The link profile is one GPU's (services/config/links.json); an engine of N
tensor-parallel GPUs gets N of them, and N host links. The host link defaults
to the committed cluster's (services/config/e2e.json); --host-link-gbps 0
leaves the host tier out. --disk names the disk profile of the cheapest-path
map (services/config/disks.json, default nvme-gen4; none: no disk tier);
every disk profile's load is also set against recompute and the pull.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Mapping, Sequence

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.services.common.cost_table import CostTable, TokenRange
from speckv.services.common.disks import DiskProfile, get_disk, load_disks
from speckv.services.common.engine_profile import LinkModel, get_profile
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.links import LinkProfile, get_link

EXAMPLE_TOKENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speckv cost", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="engine profile (services/config/engine_profiles.json)")
    parser.add_argument("--link", required=True, help="link profile, one GPU's (services/config/links.json)")
    parser.add_argument("--host-link-gbps", type=float, default=None,
                        help="one GPU's host<->device link, Gbit/s (default: e2e.json's; 0: no host tier)")
    parser.add_argument("--host-link-overhead-ms", type=float, default=None,
                        help="per host<->device copy, ms (default: e2e.json's)")
    parser.add_argument("--disk", default="nvme-gen4",
                        help="disk profile, one GPU's (services/config/disks.json); none: no disk tier")
    parser.add_argument("--disks", type=Path, default=None, help="disk profiles JSON (default: the packaged one)")
    parser.add_argument("--max-tokens", type=int, default=131072, help="longest prompt the cheapest-path map covers")
    parser.add_argument("--profiles", type=Path, default=None, help="engine profiles JSON (default: the packaged one)")
    parser.add_argument("--links", type=Path, default=None, help="link profiles JSON (default: the packaged one)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parse(argv)
    profile = get_profile(args.profile, args.profiles)
    link = get_link(args.link, args.links)
    host = _host_link(args)
    gpus = profile.tensor_parallel
    host_model = LinkModel(host.gbps * gpus, host.overhead_ms) if host is not None else None
    disk = None if args.disk == "none" or host_model is None else get_disk(args.disk, args.disks)
    table = CostTable(profile, link.model(gpus), host_model, disk.model(gpus) if disk else None)
    figures = cost_figures(table, link, args.max_tokens)
    figures["disk"] = disk.name if disk else None
    if host_model is not None:
        figures["disk_loads"] = [disk_load_figures(CostTable(profile, table.link, host_model, d.model(gpus)), d)
                                 for d in load_disks(args.disks).values()]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(render(figures))
    if args.json:
        print(f"wrote {args.json}")
    return 0


def _host_link(args: argparse.Namespace) -> LinkModel | None:
    """One GPU's host link: the flags, else the committed cluster's."""
    if args.host_link_gbps is not None and args.host_link_gbps < 0:
        raise InvalidArgument("--host-link-gbps must be >= 0 (0: no host tier)")
    if args.host_link_gbps == 0:
        return None
    committed = load_e2e_config().host_link
    gbps = args.host_link_gbps if args.host_link_gbps is not None else (committed.gbps if committed else 0.0)
    if gbps <= 0:
        return None
    overhead = args.host_link_overhead_ms
    if overhead is None:
        overhead = committed.overhead_ms if committed else 0.0
    if overhead < 0:
        raise InvalidArgument("--host-link-overhead-ms must be >= 0")
    return LinkModel(gbps, overhead)


def disk_load_figures(table: CostTable, disk: DiskProfile) -> dict:
    """Where one disk profile's load beats recompute and the peer pull."""
    assert table.disk is not None
    return {"disk": disk.name, "gbytes_s_per_gpu": disk.gbytes_s, "gbps": table.disk.gbps,
            "overhead_ms": disk.overhead_ms, "load_ms_per_token": table.ms_per_token("load"),
            "load_fixed_ms": table.fixed_ms("load"),
            "load_beats_recompute_tokens": _range(table.beats_recompute("load")),
            "load_beats_pull_tokens": _range(table.beats("load", "pull")),
            "measured": disk.sources.get("read_gbytes_s", "").startswith("MEASURED")}


def _range(found: TokenRange | None) -> list[int | None] | None:
    return None if found is None else [found[0], found[1]]


def cost_figures(table: CostTable, link: LinkProfile, max_tokens: int) -> dict:
    """Everything `speckv cost` reports, as JSON-ready values (ms, tokens, Gbit/s)."""
    profile = table.profile
    figures: dict = {
        "profile": profile.name, "model": profile.model, "hardware": profile.hardware,
        "tensor_parallel": profile.tensor_parallel, "profile_measured": profile.measured,
        "kv_bytes_per_token": table.bytes_per_token,
        "link": {"name": link.name, "gbps_per_gpu": link.gbps, "gbps": table.link.gbps,
                 "overhead_ms": table.link.overhead_ms},
        "host_link": (None if table.host_link is None else
                      {"gbps": table.host_link.gbps, "overhead_ms": table.host_link.overhead_ms}),
        "ms_per_token": {path: table.ms_per_token(path) for path in table.paths},
        "recompute_ms_per_token_pair": profile.ms_per_token_pair,
        "fixed_ms": {path: table.fixed_ms(path) for path in table.paths},
        "recompute_beats_pull_tokens": _range(table.beats("recompute", "pull")),
        "recompute_beats_promote_tokens": (_range(table.beats("recompute", "promote"))
                                           if table.host_link is not None else None),
        "recompute_beats_load_tokens": (_range(table.beats("recompute", "load"))
                                        if table.disk is not None else None),
        "max_tokens": max_tokens,
        "cheapest": [{"path": s.path, "tokens": [s.low, s.high]} for s in table.cheapest(max_tokens)],
        "cheapest_peer_only": [{"path": s.path, "tokens": [s.low, s.high]}
                               for s in table.cheapest(max_tokens, ("recompute", "pull"))],
        "cheapest_disk": ([{"path": s.path, "tokens": [s.low, s.high]}
                           for s in table.cheapest(max_tokens, ("recompute", "load", "pull"))]
                          if table.disk is not None else None),
        "examples": [],
    }
    for tokens in (t for t in EXAMPLE_TOKENS if t <= max_tokens):
        row: dict = {"prompt_tokens": tokens}
        row.update({f"{path}_ms": round(table.cost_ms(path, tokens), 3) for path in table.paths})
        row["cheapest"] = min(table.paths, key=lambda path: table.cost_ms(path, tokens))
        figures["examples"].append(row)
    return figures


def _describe(found: list[int | None] | None) -> str:
    if found is None:
        return "no prompt length"
    low, high = int(found[0] or 1), found[1]
    if high is None:
        return "every prompt length" if low == 1 else f"prompts of {low:,} tokens and up"
    return f"prompts of {low:,} to {high:,} tokens" if high > low else f"prompts of {low:,} token(s) only"


def render(figures: dict) -> str:
    link, host = figures["link"], figures["host_link"]
    kib = figures["kv_bytes_per_token"] / 1024
    lines = [
        f"speckv cost: {figures['profile']} ({figures['hardware']}; "
        f"{'fitted' if figures['profile_measured'] else 'datasheet approximation'}), KV {kib:,.1f} KiB per token",
        f"link {link['name']}: {link['gbps_per_gpu']:g} Gbit/s per GPU x {figures['tensor_parallel']} = "
        f"{link['gbps']:g} Gbit/s, {link['overhead_ms']:g} ms per transfer; host link "
        + (f"{host['gbps']:g} Gbit/s, {host['overhead_ms']:g} ms per copy" if host else "none"),
        "",
        f"{'path':<10} {'ms/token':>10} {'fixed ms':>9}   what",
    ]
    notes = {"recompute": f"prefill; + {figures['recompute_ms_per_token_pair']:.3g} ms per (query, key) pair",
             "promote": "host tier -> device over the host link, then prefill the last token",
             "load": "disk -> host tier, then host -> device as a promote, then prefill the last token",
             "pull": "peer -> this node over the link, then prefill the last token"}
    for path, per_token in figures["ms_per_token"].items():
        lines.append(f"{path:<10} {per_token:>10.5f} {figures['fixed_ms'][path]:>9.3f}   {notes[path]}")
    lines += ["", f"recompute beats pull for {_describe(figures['recompute_beats_pull_tokens'])}"]
    if host:
        lines.append(f"recompute beats promote for {_describe(figures['recompute_beats_promote_tokens'])}")
    if figures.get("recompute_beats_load_tokens") is not None or "load" in figures["ms_per_token"]:
        lines.append(f"recompute beats load ({figures.get('disk')}) for "
                     f"{_describe(figures['recompute_beats_load_tokens'])}")
    for key, where in (("cheapest_peer_only", "KV on a peer only"),
                       ("cheapest_disk", "KV on a peer and on this node's disk"),
                       ("cheapest", "KV on a peer and in every tier of this node")):
        if (key == "cheapest" and not host) or (key == "cheapest_disk" and not figures["cheapest_disk"]):
            continue
        segments = ", ".join(f"{c['path']} {c['tokens'][0]:,}-{c['tokens'][1]:,}" for c in figures[key])
        lines.append(f"cheapest up to {figures['max_tokens']:,} tokens, {where}: {segments}")
    lines += _render_disks(figures.get("disk_loads") or [])
    lines.append("")
    paths = list(figures["ms_per_token"])
    lines.append(f"{'prompt':>8} " + " ".join(f"{p + ' ms':>13}" for p in paths) + "   cheapest")
    for row in figures["examples"]:
        lines.append(f"{row['prompt_tokens']:>8,} " + " ".join(f"{row[p + '_ms']:>13,.1f}" for p in paths)
                     + f"   {row['cheapest']}")
    return "\n".join(lines)


def _render_disks(loads: list[dict]) -> list[str]:
    """One line per disk profile: where its load beats recompute and the pull."""
    if not loads:
        return []
    lines = ["", f"{'disk':<11} {'GB/s/GPU':>8} {'ms/token':>9}   load beats recompute / load beats pull"]
    for row in loads:
        name = row["disk"] + (" *" if row["measured"] else "")
        lines.append(f"{name:<11} {row['gbytes_s_per_gpu']:>8.2f} {row['load_ms_per_token']:>9.5f}   "
                     f"{_describe(row['load_beats_recompute_tokens'])} / {_describe(row['load_beats_pull_tokens'])}")
    if any(row["measured"] for row in loads):
        lines.append("  * measured on this machine (services/config/disks.json names the run)")
    return lines


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], {}))
