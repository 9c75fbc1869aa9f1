"""A vLLM engine's KV event publisher, as its ZmqEventPublisher does it, for
tests of the scheduler's feeds: real ZMQ sockets, vLLM's frames, its msgpack
schema and its replay protocol."""
from __future__ import annotations

import threading
import time

import msgpack
import zmq

from tests.support.waiting import TIMEOUT

BLOCK = 16  # vLLM's default --block-size
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class FakeVllm:
    """The publishing side of one vLLM engine, as ZmqEventPublisher does it:
    (topic, 8-byte sequence, payload) on a PUB socket (an XPUB here: a PUB
    that also hands the test the scheduler's subscription, so the test knows
    it has joined), every batch kept in a buffer, and optionally a ROUTER
    that answers a replay request (start sequence, 8 bytes) with each
    buffered (sequence, payload) from there, then (-1, b"")."""

    def __init__(self, context: zmq.Context, replay: bool, port: int | None = None, answer: bool = True,
                 replay_topic: bool = False) -> None:
        """replay_topic: replay as vLLM 0.32 does, a topic frame before each sequence (older releases: none)."""
        self._replay_topic = [b"kv-events"] if replay_topic else []
        self.pub = context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self._bind(port)
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.sequence, self.buffer, self.replay_requests = 0, [], []
        self._lock, self._stop = threading.Lock(), threading.Event()
        self.replay_endpoint = ""
        self._thread = None
        if replay:  # answer=False: a replay socket that takes requests and never answers
            router = context.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            self.replay_endpoint = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
            self._thread = threading.Thread(target=self._serve_replay, args=(router, answer), daemon=True)
            self._thread.start()

    def _bind(self, port: int | None) -> int:
        if port is None:
            return self.pub.bind_to_random_port("tcp://127.0.0.1")
        deadline = time.monotonic() + TIMEOUT
        while True:  # the port of a closed publisher frees up asynchronously
            try:
                self.pub.bind(f"tcp://127.0.0.1:{port}")
                return port
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def wait_subscribed(self) -> None:
        assert self.pub.poll(int(TIMEOUT * 1000)), "the scheduler never subscribed"
        assert self.pub.recv()[:1] == b"\x01"

    def publish(self, payload: bytes, send: bool = True) -> int:
        """Buffers the batch under the next sequence; send=False loses it on the way."""
        with self._lock:
            sequence, self.sequence = self.sequence, self.sequence + 1
            self.buffer.append((sequence, payload))
        if send:
            self.pub.send_multipart([b"", sequence.to_bytes(8, "big"), payload])
        return sequence

    def send_raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def _serve_replay(self, router: zmq.Socket, answer: bool) -> None:
        try:
            while not self._stop.is_set():
                if not router.poll(50):
                    continue
                client, _, start = router.recv_multipart()
                start_seq = int.from_bytes(start, "big")
                with self._lock:
                    self.replay_requests.append(start_seq)
                    batches = [(s, p) for s, p in self.buffer if s >= start_seq]
                if not answer:
                    continue
                for sequence, payload in batches:
                    router.send_multipart([client, b"", *self._replay_topic, sequence.to_bytes(8, "big"), payload])
                router.send_multipart([client, b"", *([b""] if self._replay_topic else []), END_SEQ, b""])
        finally:
            router.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(TIMEOUT)
        self.pub.close(linger=0)


# --- vLLM's schema, written with msgpack from its field names -----------------

def map_batch(*events) -> bytes:  # EventBatch as msgspec encodes a plain (tagged) struct
    return msgpack.packb({"ts": time.time(), "events": list(events), "data_parallel_rank": 0}, use_bin_type=True)


def map_stored(hashes, parent=None, block_size=BLOCK) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": list(range(block_size * len(hashes))), "block_size": block_size, "lora_id": None,
            "medium": "GPU", "lora_name": None}
