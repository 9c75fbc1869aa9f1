"""RouteObservation on the wire between scheduler replicas
(adapters/observation_proto.py): every field survives the round trip,
disk_blocks included (a peer books the same disk read), and a record no
Route could make is refused with InvalidArgument."""
from __future__ import annotations

import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.adapters.observation_proto import observation_from_proto, observation_to_proto
from speckv.services.scheduler.routing.observation import RouteObservation


def observation(**changes) -> RouteObservation:
    fields = dict(family=Family("f"), block_hashes=[1, 2, 3, 4], prompt_tokens=70, node_id=NodeId("n1"),
                  cached_blocks=3, fetch_blocks=0, fetch_from=None, pull_holder=NodeId("n2"), prefill_ms=12.5,
                  uncached_tokens=22, arrival_s=101.25, disk_blocks=2, enters_in_ms=35.5)
    fields.update(changes)
    return RouteObservation(**fields)


def test_a_route_observation_survives_the_wire_with_its_disk_blocks():
    o = observation()
    assert observation_from_proto(observation_to_proto(o), "routes[0]") == o
    assert observation_from_proto(observation_to_proto(observation(disk_blocks=0)), "x").disk_blocks == 0


def test_more_disk_blocks_than_cached_blocks_is_refused():
    m = observation_to_proto(observation())
    m.disk_blocks = 4
    with pytest.raises(InvalidArgument, match=r"routes\[3\]: 4 disk blocks of 3 cached"):
        observation_from_proto(m, "routes[3]")


@pytest.mark.parametrize("enters_in_ms", [-1.0, float("nan"), 4e6])
def test_an_entry_delay_no_route_could_price_is_refused(enters_in_ms):
    m = observation_to_proto(observation())
    m.enters_in_ms = enters_in_ms
    with pytest.raises(InvalidArgument, match="enters_in_ms"):
        observation_from_proto(m, "routes[0]")
