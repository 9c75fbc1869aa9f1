"""speckv simulate's worker pool: a worker that dies (the out-of-memory
killer, most often) fails the run with ResourceExhausted naming the fix,
not a BrokenProcessPool traceback."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, wait

import pytest

from speckv.loadgen.sim import cli
from speckv.services.common.errors import ResourceExhausted


def test_a_dead_worker_is_resource_exhausted_naming_jobs():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        died = pool.submit(os._exit, 9)  # what a SIGKILLed worker looks like to the pool
        wait([died], timeout=60)
        with pytest.raises(ResourceExhausted, match="--jobs") as failed:
            cli._result_of(died, 3)
    assert "3 ran at once" in str(failed.value)


def test_a_finished_worker_hands_its_result_over():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert cli._result_of(pool.submit(abs, -4), 1) == 4
