from dataclasses import replace

from speckv.services.engine.vllm_connector.identity import KVLayout, block_id, block_ids

LAYOUT = KVLayout(model="m", dtype="float32", block_size=32, num_layers=4, num_kv_heads=4, head_dim=64,
                  tp_rank=0, page_layout="cpu:H,2,N,C", hash_algo="sha256")
HASH = bytes(range(32))


def test_ids_are_stable_uint64_and_never_zero():
    first = block_id(LAYOUT.digest(), HASH)
    assert first == block_id(LAYOUT.digest(), HASH)
    assert 0 < first < 2 ** 64
    assert block_ids(LAYOUT.digest(), [HASH, HASH[::-1]]) == [first, block_id(LAYOUT.digest(), HASH[::-1])]


def test_every_layout_field_changes_the_id():
    changes = {"model": "other", "dtype": "bfloat16", "block_size": 64, "num_layers": 5, "num_kv_heads": 8,
               "head_dim": 128, "tp_rank": 1, "page_layout": "gpu:2,N,H,C", "hash_algo": "xxhash"}
    ids = {block_id(replace(LAYOUT, **{name: value}).digest(), HASH) for name, value in changes.items()}
    assert len(ids) == len(changes) and block_id(LAYOUT.digest(), HASH) not in ids


def test_other_block_hashes_give_other_ids():
    digest = LAYOUT.digest()
    assert len({block_id(digest, i.to_bytes(32, "big")) for i in range(2000)}) == 2000
