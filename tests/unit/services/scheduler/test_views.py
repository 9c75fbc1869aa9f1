"""The smallest cached prefix worth a replica equals the first length a
linear scan finds, for prompts around block boundaries."""
import pytest

from speckv.services.common.engine_profile import load_profiles
from speckv.services.scheduler.views import min_worth_blocks

PROFILE = load_profiles()["llama-3-8b-h100"]


def _scan(prompt, block_size, chain_blocks, min_benefit_ms):
    full = PROFILE.prefill_ms(max(prompt, 1), 0)
    for blocks in range(1, chain_blocks + 1):
        cached = min(blocks * block_size, max(prompt, 1) - 1)
        if full - PROFILE.prefill_ms(max(prompt, 1) - cached, cached) >= min_benefit_ms:
            return blocks
    return None


@pytest.mark.parametrize("chain_blocks", [0, 1, 2, 63, 64, 65])
@pytest.mark.parametrize("min_benefit_ms", [0.0, 1.0, 50.0, 400.0, 1e6])
@pytest.mark.parametrize("block_size", [16, 512])
def test_min_worth_blocks_matches_a_linear_scan(chain_blocks, min_benefit_ms, block_size):
    for prompt in (1, block_size, chain_blocks * block_size, chain_blocks * block_size + 7):
        assert min_worth_blocks(PROFILE, prompt, block_size, chain_blocks, min_benefit_ms) == \
            _scan(prompt, block_size, chain_blocks, min_benefit_ms)
