from speckv.services.engine.vllm_connector.plan import RequestTrack, loadable_blocks, new_matched_blocks, save_spec


def test_a_load_leaves_the_last_prompt_token_to_the_engine():
    assert loadable_blocks(prompt_tokens=64, block_size=32, known_hashes=2) == 1
    assert loadable_blocks(prompt_tokens=65, block_size=32, known_hashes=2) == 2
    assert loadable_blocks(prompt_tokens=200, block_size=32, known_hashes=3) == 3
    assert loadable_blocks(prompt_tokens=1, block_size=32, known_hashes=0) == 0


def test_matched_blocks_start_past_the_engines_own_hit():
    assert new_matched_blocks(local_tokens=64, block_size=32, store_prefix=5) == 3
    assert new_matched_blocks(local_tokens=96, block_size=32, store_prefix=2) == 0


def test_each_full_block_is_saved_once_with_its_parent():
    track = RequestTrack("r", page_ids=[7, 3, 9, 4], saved_upto=1)  # block 0 was the engine's own hit
    ids = [11, 12, 13]
    spec = save_spec(track, ids, computed_tokens=100, block_size=32)  # 3 full blocks computed
    assert spec is not None and spec.page_ids == (3, 9) and spec.block_ids == (12, 13)
    assert spec.parents == (11, 12) and spec.family == "11"
    assert save_spec(track, ids, computed_tokens=100, block_size=32) is None
    spec = save_spec(track, ids + [14], computed_tokens=128, block_size=32)
    assert spec is not None and spec.block_ids == (14,) and spec.page_ids == (4,)


def test_a_block_whose_hash_is_not_known_yet_waits():
    track = RequestTrack("r", page_ids=[1, 2])
    spec = save_spec(track, [5], computed_tokens=64, block_size=32)
    assert spec is not None and spec.block_ids == (5,) and spec.parents == (None,)
    assert track.saved_upto == 1
