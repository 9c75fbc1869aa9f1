from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import InvalidArgument
from speckv.services.kvstore.token_bucket import TokenBucket, gbit_to_bytes_per_s


def test_full_bucket_lets_a_burst_through_then_charges_debt():
    clock = ManualClock(10.0)
    bucket = TokenBucket(rate=1000.0, clock=clock, burst=500.0)
    assert bucket.take(500) == 0.0
    assert bucket.take(250) == pytest.approx(0.25)  # 250 bytes of debt at 1000 B/s
    assert bucket.take(250) == pytest.approx(0.5)  # debt accumulates


def test_refill_is_capped_at_the_burst():
    clock = ManualClock(0.0)
    bucket = TokenBucket(rate=100.0, clock=clock, burst=200.0)
    bucket.take(200)
    clock.advance(100.0)  # would refill 10,000 bytes
    assert bucket.take(200) == 0.0
    assert bucket.take(100) == pytest.approx(1.0)


def test_long_run_rate_never_exceeds_the_cap_for_any_chunk_size():
    clock = ManualClock(0.0)
    rate, chunk = 1e6, 4 * 1024 * 1024  # a chunk far larger than the burst
    bucket = TokenBucket(rate=rate, clock=clock)
    sent = 0
    for _ in range(50):
        clock.advance(bucket.take(chunk))  # the sender sleeps as told, then sends
        sent += chunk
    assert sent / clock.now() <= rate * 1.01
    assert sent / clock.now() >= rate * 0.95  # and it is not needlessly slower


def test_gbit_conversion_and_bad_arguments():
    assert gbit_to_bytes_per_s(8.0) == 1e9
    with pytest.raises(InvalidArgument, match="rate"):
        TokenBucket(0.0, ManualClock())
    with pytest.raises(InvalidArgument, match="nbytes"):
        TokenBucket(1.0, ManualClock()).take(-1)
