"""The live bench reports the scheduler's action outcomes in real-model bytes (e2e.real_bytes)."""
import pytest

from speckv.loadgen.bench.e2e.cli import real_bytes
from speckv.services.scheduler.replication.outcomes import ActionStats


def _stats() -> ActionStats:
    stats = ActionStats(orders=3, bytes=300, expected_ms=9.0, read_after_lease=1, bytes_read_after_lease=100)
    stats.bytes_by_outcome.update(used_in_time=100, never_used=200)
    stats.outcomes.update(used_in_time=1, never_used=2)
    part = stats.of_forecast("return")
    part.orders, part.bytes, part.bytes_read_after_lease = 2, 200, 100
    part.bytes_by_outcome.update(never_used=200)
    return stats


@pytest.mark.parametrize("scale", [1.0, 1024.0, 0.5])
def test_every_byte_figure_scales_and_nothing_else(scale):
    stats = _stats()
    scaled = real_bytes(stats, scale)
    assert scaled.bytes == round(300 * scale) and scaled.bytes_read_after_lease == round(100 * scale)
    assert scaled.bytes_by_outcome["never_used"] == round(200 * scale)
    assert scaled.by_forecast["return"].bytes == round(200 * scale)
    assert scaled.by_forecast["return"].bytes_read_after_lease == round(100 * scale)
    assert (scaled.orders, scaled.outcomes, scaled.expected_ms) == (3, stats.outcomes, 9.0)
    assert scaled.bytes_used_in_time_share == stats.bytes_used_in_time_share == pytest.approx(1 / 3)
    assert stats.bytes == 300 and stats.by_forecast["return"].bytes == 200  # the original is left as it was
