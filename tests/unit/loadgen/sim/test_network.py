"""The network model: an uncontended transfer costs the live link model's
time; transfers sharing a link share its bandwidth."""
from __future__ import annotations

import pytest

from speckv.loadgen.sim.event_loop import EventQueue
from speckv.loadgen.sim.network import Network
from speckv.services.common.engine_profile import LinkModel

LINK = LinkModel(gbps=8.0, overhead_ms=1.0)  # 1e9 bytes/s: 1 GB takes 1 s + 1 ms
GB = 10**9


def run(transfers: list[tuple[float, str, str, int]]) -> dict[int, float]:
    """Starts each (time, source, target, bytes); returns index -> duration s."""
    q = EventQueue()
    net = Network(q, LINK)
    done: dict[int, float] = {}
    for i, (t, src, dst, n) in enumerate(transfers):
        q.at(t, lambda i=i, t=t, src=src, dst=dst, n=n:
             net.start(src, dst, n, lambda tr, i=i, t=t: done.__setitem__(i, q.now() - t)))
    q.run()
    return done


def test_a_lone_transfer_takes_the_link_models_time():
    assert run([(0.0, "a", "b", GB)])[0] == pytest.approx(LINK.transfer_ms(GB) / 1e3, rel=1e-12)


def test_two_concurrent_transfers_on_one_link_each_get_half_the_bandwidth():
    both = run([(0.0, "a", "b", GB), (0.0, "a", "b", GB)])
    assert both[0] == pytest.approx(0.001 + 2.0, rel=1e-12)  # half the rate: twice as long
    assert both[1] == pytest.approx(0.001 + 2.0, rel=1e-12)
    # Sharing only the source's egress halves it too; disjoint pairs do not interfere.
    assert run([(0.0, "a", "b", GB), (0.0, "a", "c", GB)])[0] == pytest.approx(2.001, rel=1e-12)
    assert run([(0.0, "a", "b", GB), (0.0, "c", "d", GB)])[0] == pytest.approx(1.001, rel=1e-12)


def test_a_replication_occupies_both_ends():
    # b -> c shares c's ingress with a -> c, and a's egress is shared with a -> d:
    # a->c runs at min(1/2, 1/2) = 0.5 GB/s, as do the others.
    out = run([(0.0, "a", "c", GB), (0.0, "b", "c", GB), (0.0, "a", "d", GB)])
    assert out[0] == pytest.approx(2.001, rel=1e-12)


def test_a_transfer_joining_later_slows_the_first_only_while_both_flow():
    # The first flows alone from 0.001 s to 0.500 s (the second's bytes start
    # after its 1 ms overhead): 0.499 GB sent. Then both at 0.5 GB/s: the
    # first's remaining 0.501 GB take 1.002 s (done at 1.502 s); the second
    # has sent 0.501 GB by then and sends its last 0.499 GB alone (done at 2.001 s).
    out = run([(0.0, "a", "b", GB), (0.499, "a", "b", GB)])
    assert out[0] == pytest.approx(1.502, rel=1e-9)
    assert out[1] == pytest.approx(2.001 - 0.499, rel=1e-9)
