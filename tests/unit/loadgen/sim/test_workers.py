"""speckv simulate's worker pool: a worker that dies (the out-of-memory
killer, most often) fails the run with ResourceExhausted naming the fix,
not a BrokenProcessPool traceback."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, wait

import pytest

from speckv.loadgen.sim.pool import result_of
from speckv.services.common.errors import ResourceExhausted


def test_a_dead_worker_is_resource_exhausted_naming_jobs():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        died = executor.submit(os._exit, 9)  # what a SIGKILLed worker looks like to the pool
        wait([died], timeout=60)
        with pytest.raises(ResourceExhausted, match="--jobs") as failed:
            result_of(died, 3)
    assert "3 ran at once" in str(failed.value)


def test_a_finished_worker_hands_its_result_over():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        assert result_of(executor.submit(abs, -4), 1) == 4
