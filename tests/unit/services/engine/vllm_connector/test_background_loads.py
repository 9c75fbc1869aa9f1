"""BackgroundLoads: each request reported once, after all of its loads end,
failed when any failed; a load that raises is a failure, not a lost request."""
import threading

from speckv.services.engine.vllm_connector.background_loads import BackgroundLoads
from speckv.services.engine.vllm_connector.plan import LoadSpec


def spec(req: str, page: int) -> LoadSpec:
    return LoadSpec(req, (page,), (page + 100,))


def test_a_request_is_reported_once_after_all_its_loads_and_failed_if_any_failed():
    gate = threading.Event()

    def load(s: LoadSpec) -> bool:
        gate.wait(10)
        if s.page_ids == (3,):
            raise RuntimeError("boom")
        return s.page_ids != (2,)

    loads = BackgroundLoads(load)
    loads.start([spec("a", 1), spec("b", 2), spec("b", 4), spec("c", 3)])
    assert loads.take_finished() == (set(), set()) and loads.in_flight() == 3
    gate.set()
    loads.shutdown()
    assert loads.take_finished() == ({"a", "b", "c"}, {"b", "c"})
    assert loads.take_finished() == (set(), set()) and loads.in_flight() == 0
