"""The connector's scheduler half: how many blocks past the engine's own
prefix-cache hit the node's kvstore holds (one Lookup per request, cached,
since vLLM may ask again), which pages to load them into, and which newly
computed full blocks each step saves.

On the kvstore's host the lookup pins what it finds (MapBlocks with prefix,
kvstore_client.map_prefix): the lease rides the step's LoadSpec to the
worker, which copies from the pinned pages without a call and then releases
it; a lookup no load takes (nothing to load after all, or the request
finished) is released here.

Pulls at request time: a router whose Route chose to fetch a prefix from
another node names it in the request's kv_transfer_params,
`{"speckv": {"pull_from": NODE}}`. When NODE is one of the connector's
`peers` and its kvstore holds more of the prompt than this node's, the
blocks past this node's own prefix load from the peer's kvstore (one Lookup
there per request). The worker asks that kvstore to copy them into this
node's (Replicate, a pull into itself, over the kvstores' data plane) and
loads them from there, so the pull leaves them here as an order would. A
peer that is unknown, down or slow costs the pull, never the request.

Loads are synchronous by default (get_num_new_matched_tokens answers
load_async False): the worker fills the pages in start_load_kv before the
step's forward. With `load_async` it answers True: vLLM parks the request
with its pages allocated, the worker loads them beside the steps
(background_loads.py) and reports the request finished (or failed: then it
is recomputed from its start, and never offered a load again). A request
that ends while its load runs keeps its pages until the load is reported
(request_finished answers delay).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Mapping

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
PARAMS_KEY = "speckv"  # speckv's entry in a request's kv_transfer_params
MAX_UNKNOWN_PEERS_LOGGED = 32  # distinct unknown peer names logged (once each); later ones are counted only


def pull_source(params: Any) -> str:
    """The node a request's kv_transfer_params asks to pull from ("" none)."""
    if not isinstance(params, Mapping):
        return ""
    ours = params.get(PARAMS_KEY)
    source = ours.get("pull_from") if isinstance(ours, Mapping) else None
    return source if isinstance(source, str) else ""


class SchedulerSide:
    def __init__(self, layout: KVLayout, client: KVStorePort, counters: Counters,
                 peers: Mapping[str, KVStorePort] | None = None, load_async: bool = False) -> None:
        """peers: the kvstores a request may name to pull from, by node id;
        load_async: load beside the steps (module docstring)."""
        self._layout = layout
        self._async = load_async
        self._to_start: list[LoadSpec] = []  # async loads planned, for the next step's metadata
        self._loading: set[str] = set()  # requests whose async loads have not been reported ended
        self._load_failed: set[str] = set()  # an async load failed: recomputed, never offered a load again
        self._peers = dict(peers or {})
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
        self._pulls: dict[str, tuple[str, int]] = {}  # req_id -> (peer, blocks it holds from the start)
        self._unknown_peers: set[str] = set()  # named by a request but not in `peers` (logged once each)

    def _block_ids(self, request: "Request") -> list[int]:
        ids = self._ids.setdefault(request.request_id, [])
        hashes = request.block_hashes
        if len(ids) < len(hashes):
            ids.extend(block_ids(self._digest, hashes[len(ids):]))
        return ids

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        self._local[request.request_id] = num_computed_tokens
        if request.request_id in self._load_failed:
            return 0, False
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
            self._look_at_peer(request, ids)
        held = max(self._matched[request.request_id], self._pulls.get(request.request_id, ("", 0))[1])
        blocks = new_matched_blocks(num_computed_tokens, self._block_size, min(held, limit))
        return blocks * self._block_size, self._async and blocks > 0

    def _look_at_peer(self, request: "Request", ids: list[int]) -> None:
        """Asks the peer the request names how much of it it holds; kept
        only when that is more than this node's kvstore holds."""
        source = pull_source(getattr(request, "kv_transfer_params", None))
        if not source:
            return
        peer = self._peers.get(source)
        if peer is None:
            self._counters.add(pulls_refused=1)
            if source not in self._unknown_peers and len(self._unknown_peers) < MAX_UNKNOWN_PEERS_LOGGED:
                self._unknown_peers.add(source)  # bounded: the names come from API clients
                log.warning("speckv: a request asks to pull from %r, not among the connector's peers %s; "
                            "it is not pulled", source, sorted(self._peers))
            return
        own = self._matched[request.request_id]
        held = peer.prefix_blocks(ids)
        if held > own:
            self._pulls[request.request_id] = (source, held)

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
        end = start + num_external_tokens // self._block_size
        lease = self._leases.pop(request.request_id, None)
        # The lookups go with this load: a later ask looks again.
        own = min(self._matched.pop(request.request_id, 0), end)
        source, _ = self._pulls.pop(request.request_id, ("", 0))
        track.pending_loads = []
        if own > start:
            track.pending_loads.append(LoadSpec(request.request_id, tuple(pages[start:own]), tuple(ids[start:own]),
                                                lease, start))
        elif lease is not None:
            self._client.release(lease)
        pulled_from = max(start, own)
        if source and end > pulled_from:
            track.pending_loads.append(LoadSpec(request.request_id, tuple(pages[pulled_from:end]),
                                                tuple(ids[pulled_from:end]), source=source, family=str(ids[0])))
        self._counters.add(blocks_matched=end - start)
        if self._async and track.pending_loads:
            # The request waits for these, unscheduled: they go out with the next step's metadata.
            self._to_start.extend(track.pending_loads)
            track.pending_loads = []
            self._loading.add(request.request_id)

    def build_step(self, output: "SchedulerOutput") -> StepPlan:
        plan = StepPlan(async_loads=self._to_start)
        self._to_start = []
        for new in output.scheduled_new_reqs:
            track = self._tracks.setdefault(new.req_id, RequestTrack(new.req_id))
            track.page_ids = list(new.block_ids[0])
            # Blocks the engine had or loads now are not saved again.
            track.saved_upto = new.num_computed_tokens // self._block_size
            self._take_loads(plan, track)
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
                self._take_loads(plan, track)  # it was matched again when it went back to waiting
            elif new_pages is not None:
                track.page_ids.extend(new_pages[0])
            self._plan_save(plan, track, cached.num_computed_tokens[i] + output.num_scheduled_tokens.get(req_id, 0))
        return plan

    @staticmethod
    def _take_loads(plan: StepPlan, track: RequestTrack) -> None:
        plan.loads.extend(track.pending_loads)
        track.pending_loads = []

    def _plan_save(self, plan: StepPlan, track: RequestTrack, computed_after: int) -> None:
        request = self._requests.get(track.req_id)
        if request is None:
            return
        spec = save_spec(track, self._block_ids(request), computed_after, self._block_size)
        if spec is not None:
            plan.saves.append(spec)

    def loads_ended(self, finished: set[str], failed: set[str]) -> None:
        """The worker's report (vLLM's finished_recving / failed_recving)."""
        self._loading -= finished
        self._load_failed |= {r for r in failed if r in self._tracks}  # not of requests already finished
        if failed:
            self._counters.add(async_load_failures=len(failed))

    def request_finished(self, request: "Request") -> bool:
        """Forgets the request; whether vLLM must keep its pages until its
        async load is reported (it then frees them)."""
        self._drop_lease(request.request_id)
        for table in (self._matched, self._tracks, self._requests, self._ids, self._local, self._pulls):
            table.pop(request.request_id, None)
        self._load_failed.discard(request.request_id)
        return request.request_id in self._loading

    def _drop_lease(self, req_id: str) -> None:
        """Forgets a lookup no load will use (its answer, its peer's answer)
        and ends its pins if it pinned any: a later ask looks again, so a
        preempted request never loads on a stale answer."""
        self._matched.pop(req_id, None)
        self._pulls.pop(req_id, None)
        lease = self._leases.pop(req_id, None)
        if lease is not None:
            self._client.release(lease)
