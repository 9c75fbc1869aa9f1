"""NodeSizes: the last tier is the host tier when there is one, and a
retention share rounds down to blocks of that tier, as the kvstore sizes it."""
import dataclasses

import pytest

from speckv.services.common.node_sizes import NodeSizes


def test_the_last_tier_is_the_host_tier_when_there_is_one():
    assert NodeSizes(100).last_tier_pages == 100
    assert NodeSizes(100, 400).last_tier_pages == 400


@pytest.mark.parametrize("device, host, share, cap", [(100, 0, 0.5, 50), (100, 401, 0.5, 200), (7, 0, 0.0, 0),
                                                      (3, 0, 0.34, 1)])
def test_a_retention_share_rounds_down_to_blocks_of_the_last_tier(device, host, share, cap):
    assert NodeSizes.with_retain_share(device, host, share) == NodeSizes(device, host, cap)


def test_sizes_are_one_frozen_record():
    sizes = NodeSizes(100, 0, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sizes.host_pages = 1  # type: ignore[misc]
    assert not hasattr(sizes, "__dict__")  # slotted
