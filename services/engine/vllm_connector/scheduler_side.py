"""The connector's scheduler half: how many blocks past the engine's own
prefix-cache hit the node's kvstore holds (one Lookup per request, cached,
since vLLM may ask again), which pages to load them into, and which newly
computed full blocks each step saves.

On the kvstore's host the lookup pins what it finds (MapBlocks with prefix,
kvstore_client.map_prefix): the lease rides the step's LoadSpec to the
worker, which copies from the pinned pages without a call and then releases
it; a lookup no load takes (nothing to load after all, or the request
finished) is released here.

Loads are synchronous (get_num_new_matched_tokens answers load_async False):
the worker fills the pages in start_load_kv before the step's forward.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from speckv.services.engine.vllm_connector.identity import KVLayout, block_ids
from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.port import KVStorePort, ReadLease
from speckv.services.engine.vllm_connector.plan import (
    LoadSpec, RequestTrack, StepPlan, loadable_blocks, new_matched_blocks, save_spec)

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger("speckv.vllm_connector")
LEASE_MARGIN_S = 1.0  # a lookup's pins this close to lapsing are renewed before a load relies on them


class SchedulerSide:
    def __init__(self, layout: KVLayout, client: KVStorePort, counters: Counters) -> None:
        self._layout = layout
        self._digest = layout.digest()
        self._client = client
        self._counters = counters
        self._block_size = layout.block_size
        self._matched: dict[str, int] = {}  # req_id -> blocks the kvstore holds from the start (one Lookup)
        self._tracks: dict[str, RequestTrack] = {}
        self._requests: dict[str, "Request"] = {}
        self._ids: dict[str, list[int]] = {}  # req_id -> speckv ids of its hashed blocks so far
        self._local: dict[str, int] = {}  # req_id -> tokens of the engine's own prefix-cache hit
        self._leases: dict[str, ReadLease] = {}  # req_id -> its lookup's pinned blocks, until a load takes them

    def _block_ids(self, request: "Request") -> list[int]:
        ids = self._ids.setdefault(request.request_id, [])
        hashes = request.block_hashes
        if len(ids) < len(hashes):
            ids.extend(block_ids(self._digest, hashes[len(ids):]))
        return ids

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        self._local[request.request_id] = num_computed_tokens
        limit = loadable_blocks(request.num_prompt_tokens, self._block_size, len(request.block_hashes))
        if num_computed_tokens // self._block_size >= limit:
            return 0, False
        lease = self._leases.get(request.request_id)
        if lease is not None and time.monotonic() > lease.until - LEASE_MARGIN_S:
            self._drop_lease(request.request_id)  # asked again after its pins lapsed (or nearly): look again
        if request.request_id not in self._matched:
            ids = self._block_ids(request)[:limit]
            lease = self._client.map_prefix(ids)
            if lease is not None:
                self._leases[request.request_id] = lease
            self._matched[request.request_id] = len(lease.ids) if lease is not None else \
                self._client.prefix_blocks(ids)
        blocks = new_matched_blocks(num_computed_tokens, self._block_size,
                                    min(self._matched[request.request_id], limit))
        return blocks * self._block_size, False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        track = self._tracks.setdefault(request.request_id, RequestTrack(request.request_id))
        self._requests[request.request_id] = request
        if num_external_tokens <= 0:
            self._drop_lease(request.request_id)
            return
        pages = blocks.get_block_ids()[0]
        ids = self._block_ids(request)
        start = self._local.get(request.request_id, 0) // self._block_size  # the engine's own hit
        count = num_external_tokens // self._block_size
        lease = self._leases.pop(request.request_id, None)
        self._matched.pop(request.request_id, None)  # the lease goes with this load: a later ask looks again
        track.pending_load = LoadSpec(request.request_id, tuple(pages[start:start + count]),
                                      tuple(ids[start:start + count]), lease, start)
        self._counters.add(blocks_matched=count)

    def build_step(self, output: "SchedulerOutput") -> StepPlan:
        plan = StepPlan()
        for new in output.scheduled_new_reqs:
            track = self._tracks.setdefault(new.req_id, RequestTrack(new.req_id))
            track.page_ids = list(new.block_ids[0])
            # Blocks the engine had or loads now are not saved again.
            track.saved_upto = new.num_computed_tokens // self._block_size
            if track.pending_load is not None:
                plan.loads.append(track.pending_load)
                track.pending_load = None
            self._plan_save(plan, track, new.num_computed_tokens + output.num_scheduled_tokens.get(new.req_id, 0))
        cached = output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            track = self._tracks.get(req_id)
            if track is None:
                continue
            new_pages = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:  # preempted and resumed: the whole page list anew
                track.page_ids = list(new_pages[0]) if new_pages is not None else []
                track.saved_upto = min(track.saved_upto, cached.num_computed_tokens[i] // self._block_size)
                if track.pending_load is not None:  # it was matched again when it went back to waiting
                    plan.loads.append(track.pending_load)
                    track.pending_load = None
            elif new_pages is not None:
                track.page_ids.extend(new_pages[0])
            self._plan_save(plan, track, cached.num_computed_tokens[i] + output.num_scheduled_tokens.get(req_id, 0))
        return plan

    def _plan_save(self, plan: StepPlan, track: RequestTrack, computed_after: int) -> None:
        request = self._requests.get(track.req_id)
        if request is None:
            return
        spec = save_spec(track, self._block_ids(request), computed_after, self._block_size)
        if spec is not None:
            plan.saves.append(spec)

    def request_finished(self, request: "Request") -> None:
        self._drop_lease(request.request_id)
        for table in (self._matched, self._tracks, self._requests, self._ids, self._local):
            table.pop(request.request_id, None)

    def _drop_lease(self, req_id: str) -> None:
        """Ends the pins of a lookup no load will use, and forgets its answer."""
        lease = self._leases.pop(req_id, None)
        if lease is not None:
            self._matched.pop(req_id, None)
            self._client.release(lease)
