"""An emulated engine on the Llama-3-8B H100 profile, and helpers that run it to idle."""
from __future__ import annotations

from speckv.loadgen.engines.emulated import EmulatedEngine, EngineEventKind, EngineLimits
from speckv.services.common.engine_profile import LinkModel, get_profile

PROFILE = get_profile("llama-3-8b-h100")
LIMITS = EngineLimits(max_batched_tokens=8192, max_num_seqs=256, decode_weights_ms=4.8,
                      hbm_gb_per_s=3350.0, decode_step_overhead_ms=1.0)
LINK = LinkModel(25.0, 1.0)
KV_PER_TOKEN = 128 * 1024


def engine(limits: EngineLimits = LIMITS) -> EmulatedEngine:
    return EmulatedEngine("node-0", PROFILE, limits, LINK, KV_PER_TOKEN)


def run_until_idle(e: EmulatedEngine) -> list:
    events = []
    while (t := e.next_event_s()) is not None:
        events += e.advance(t)
    return events


def first_token(events, request_id):
    return next(ev.time_s for ev in events if ev.kind is EngineEventKind.FIRST_TOKEN and ev.job.request_id == request_id)
