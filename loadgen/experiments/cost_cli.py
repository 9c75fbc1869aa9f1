"""`speckv cost`: which regime a cluster is in. For an engine profile and a
link profile, the price per token of recomputing a prompt's KV, promoting it
from the node's host tier and pulling it from a peer, and the prompt lengths
where each is cheapest (services/common/cost_table.py has the model).

    speckv cost --profile llama-3-8b-h100-vidur --link tcp-25g
    speckv cost --profile llama-2-70b-h100-tp4-vidur --link rdma-400g --json out/cost.json

The link profile is one GPU's (services/config/links.json); an engine of N
tensor-parallel GPUs gets N of them, and N host links. The host link defaults
to the committed cluster's (services/config/e2e.json); --host-link-gbps 0
leaves the host tier out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Mapping, Sequence

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.services.common.cost_table import CostTable, TokenRange
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
    table = CostTable(profile, link.model(gpus),
                      LinkModel(host.gbps * gpus, host.overhead_ms) if host is not None else None)
    figures = cost_figures(table, link, args.max_tokens)
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
        "max_tokens": max_tokens,
        "cheapest": [{"path": s.path, "tokens": [s.low, s.high]} for s in table.cheapest(max_tokens)],
        "cheapest_peer_only": [{"path": s.path, "tokens": [s.low, s.high]}
                               for s in table.cheapest(max_tokens, ("recompute", "pull"))],
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
        return f"prompts of {low:,} tokens and up"
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
             "pull": "peer -> this node over the link, then prefill the last token"}
    for path, per_token in figures["ms_per_token"].items():
        lines.append(f"{path:<10} {per_token:>10.5f} {figures['fixed_ms'][path]:>9.3f}   {notes[path]}")
    lines += ["", f"recompute beats pull for {_describe(figures['recompute_beats_pull_tokens'])}"]
    if host:
        lines.append(f"recompute beats promote for {_describe(figures['recompute_beats_promote_tokens'])}")
    for key, where in (("cheapest_peer_only", "KV on a peer only"), ("cheapest", "KV on a peer and in the host tier")):
        if key == "cheapest" and not host:
            continue
        segments = ", ".join(f"{c['path']} {c['tokens'][0]:,}-{c['tokens'][1]:,}" for c in figures[key])
        lines.append(f"cheapest up to {figures['max_tokens']:,} tokens, {where}: {segments}")
    lines.append("")
    paths = list(figures["ms_per_token"])
    lines.append(f"{'prompt':>8} " + " ".join(f"{p + ' ms':>13}" for p in paths) + "   cheapest")
    for row in figures["examples"]:
        lines.append(f"{row['prompt_tokens']:>8,} " + " ".join(f"{row[p + '_ms']:>13,.1f}" for p in paths)
                     + f"   {row['cheapest']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], {}))
