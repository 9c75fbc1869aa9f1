"""The tagging thread gives each chunk the tag computed inline would, one
chunk at a time, hands a failure back to the caller, and stops on close even
with a tag still pending."""
from __future__ import annotations

import os

import pytest
from cryptography.exceptions import AlreadyFinalized

from speckv.services.kvstore.dataplane.possession import ChunkMac
from speckv.services.kvstore.dataplane.tagger import Tagger

KEY = bytes(range(32))


def inline_tag(offset: int, pieces: list[memoryview]) -> bytes:
    mac = ChunkMac(KEY, "h", offset, sum(len(p) for p in pieces), 7)
    for piece in pieces:
        mac.update(piece)
    return mac.tag()


def test_each_chunk_gets_the_tag_computed_inline():
    tagger = Tagger("test-tag")
    data = memoryview(os.urandom(3 << 20))
    try:
        for offset, pieces in ((0, [data[:1 << 20]]), (1 << 20, [data[1 << 20:(3 << 19)], data[3 << 19:2 << 20]]),
                               (2 << 20, [data[2 << 20:]])):
            tagger.start(ChunkMac(KEY, "h", offset, sum(len(p) for p in pieces), 7), pieces)
            assert tagger.tag() == inline_tag(offset, pieces)
    finally:
        tagger.close()


def test_a_second_start_before_the_tag_is_refused():
    tagger = Tagger("test-tag")
    piece = memoryview(b"x" * 1024)
    tagger.start(ChunkMac(KEY, "h", 0, 1024, 7), [piece])
    with pytest.raises(RuntimeError, match="still pending"):
        tagger.start(ChunkMac(KEY, "h", 1024, 1024, 7), [piece])
    tagger.close()  # waits out the pending tag
    with pytest.raises(RuntimeError, match="no chunk"):
        tagger.tag()


def test_a_failure_on_the_thread_is_raised_by_tag():
    tagger = Tagger("test-tag")
    mac = ChunkMac(KEY, "h", 0, 4, 7)
    mac.tag()  # finalized: a further update fails
    tagger.start(mac, [memoryview(b"abcd")])
    with pytest.raises(AlreadyFinalized):
        tagger.tag()
    tagger.start(ChunkMac(KEY, "h", 0, 4, 7), [memoryview(b"abcd")])  # the thread lives on
    assert tagger.tag() == inline_tag(0, [memoryview(b"abcd")])
    tagger.close()
