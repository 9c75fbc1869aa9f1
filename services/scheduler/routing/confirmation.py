"""The half of a route that runs outside the scheduler's lock: confirm the
cached prefix with the chosen node's kvstore (PrefixConfirmer), re-estimate
the decision when its answer differs from the block index, and offer the
arrival to the predictor's sink (ArrivalSink, never blocks).

A kvstore that does not answer leaves the index's figure standing
(`confirmed=False`); only the transitions (stops answering, answers again)
are logged, once per address.
"""
from __future__ import annotations

import logging
from dataclasses import replace

from speckv.services.scheduler.arrival_reports import ArrivalRecord
from speckv.services.scheduler.ports import ArrivalSink, PrefixConfirmer
from speckv.services.scheduler.routing.route_records import PickedRoute, RouteResult
from speckv.services.scheduler.routing.router import KvAwareRouter, RouteQuery, best_holder

log = logging.getLogger(__name__)


class RouteConfirmation:
    def __init__(self, router: KvAwareRouter, confirmer: PrefixConfirmer | None,
                 arrivals: ArrivalSink | None) -> None:
        self._router = router
        self._confirmer, self._arrivals = confirmer, arrivals
        self._unconfirmed: set[str] = set()  # addresses whose last Lookup failed (log transitions only)

    def finish(self, query: RouteQuery, picked: PickedRoute, arrival_s: float) -> RouteResult:
        """Confirms the prefix with the chosen node (outside the lock) and reports the arrival."""
        decision = picked.decision
        confirmed = self._confirm(picked.address, query.block_hashes)
        if confirmed is not None and confirmed != decision.cached_blocks:
            chosen = next(c for c in picked.candidates if c.node_id == decision.node_id)
            others = [c for c in picked.candidates if c.node_id != decision.node_id]
            # The kvstore confirms the prefix over both tiers, not which tier:
            # the index's host-only count stands, capped by the prefix.
            decision = self._router.estimate(
                query, replace(chosen, cached_blocks=confirmed, host_blocks=min(chosen.host_blocks, confirmed),
                               disk_blocks=min(chosen.disk_blocks, confirmed)),
                best_holder(others))
        result = RouteResult(decision.node_id, picked.address, decision.cached_blocks, decision.expected_ttft_ms,
                             decision.queue_ms, decision.prefill_ms, decision.fetch_ms, decision.fetch_from,
                             decision.fetch_blocks, query.family, confirmed is not None, decision.promote_ms,
                             decision.promote_blocks, picked.observation, decision.disk_blocks)
        if self._arrivals is not None:
            cached_tokens = min(result.cached_blocks * picked.block_size, query.prompt_tokens)
            self._arrivals.offer(ArrivalRecord(arrival_s, query.family, result.node_id,
                                               query.prompt_tokens, cached_tokens))
        return result

    def _confirm(self, address: str, hashes: list[int]) -> int | None:
        if self._confirmer is None or not hashes or not self._confirmer.asks(address):
            return None
        confirmed = self._confirmer.confirm(address, hashes)
        if confirmed is None and address not in self._unconfirmed:
            log.warning("kvstore %s did not answer Lookup; routing on the block index alone", address)
            self._unconfirmed.add(address)
        elif confirmed is not None and address in self._unconfirmed:
            log.info("kvstore %s answers Lookup again", address)
            self._unconfirmed.discard(address)
        return confirmed
