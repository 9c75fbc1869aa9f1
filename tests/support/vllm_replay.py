"""Asking a vLLM-format replay socket for missed batches, as the scheduler's
subscriber asks (a DEALER): shared by the kvstore publisher's tests."""
from __future__ import annotations

import zmq

from speckv.services.scheduler.adapters.vllm_decode import replay_request, split_replay_frames
from tests.support.waiting import TIMEOUT


def replay(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """(sequence, payload) of every batch the replay socket at endpoint
    answers from start on, up to its end marker."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart(replay_request(start))
        batches = []
        while True:
            assert dealer.poll(int(TIMEOUT * 1000)), "the replay socket did not answer"
            item = split_replay_frames(dealer.recv_multipart())
            if item is None:
                return batches
            batches.append(item)
    finally:
        dealer.close(linger=0)
        context.term()
