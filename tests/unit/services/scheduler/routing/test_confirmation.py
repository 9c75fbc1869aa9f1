"""The half of a route outside the lock: a kvstore that does not answer
leaves the index's figure (confirmed=False), logged once until it answers
again; every route is offered as an arrival."""
from speckv.services.common.engine_profile import LinkModel, load_profiles
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.routing.confirmation import RouteConfirmation
from speckv.services.scheduler.routing.route_records import PickedRoute
from speckv.services.scheduler.routing.router import Candidate, KvAwareRouter, RouteDecision, RouteQuery

PROFILE = load_profiles()["llama-3-8b-h100"]


class Confirmer:
    answer: int | None = None

    def asks(self, address):
        return True

    def confirm(self, address, block_hashes):
        return self.answer


class Sink:
    def __init__(self):
        self.offered = []

    def offer(self, arrival):
        self.offered.append(arrival)
        return True


def picked(cached: int) -> PickedRoute:
    decision = RouteDecision(NodeId("a"), cached, 10.0, 1.0, 9.0)
    return PickedRoute(decision, [Candidate(NodeId("a"), 0, cached, 16, 1024, 1.0)], "h:a", 16)


def test_an_unanswered_lookup_keeps_the_index_figure_and_is_logged_once_per_transition(caplog):
    confirmer, sink = Confirmer(), Sink()
    confirmation = RouteConfirmation(KvAwareRouter(PROFILE, LinkModel(25.0, 1.0)), confirmer, sink)
    query = RouteQuery("r", [1, 2, 3], 64, Family("f"))
    with caplog.at_level("INFO"):
        results = [confirmation.finish(query, picked(2), 5.0) for _ in range(2)]
        confirmer.answer = 2
        results.append(confirmation.finish(query, picked(2), 5.0))
    assert [(r.cached_blocks, r.confirmed) for r in results] == [(2, False), (2, False), (2, True)]
    assert caplog.text.count("did not answer Lookup") == 1 and caplog.text.count("answers Lookup again") == 1
    assert [(a.node_id, a.cached_tokens) for a in sink.offered] == [("a", 32)] * 3


def test_a_confirmed_shorter_prefix_re_estimates_the_route():
    confirmer = Confirmer()
    confirmer.answer = 1
    confirmation = RouteConfirmation(KvAwareRouter(PROFILE, LinkModel(25.0, 1.0)), confirmer, None)
    result = confirmation.finish(RouteQuery("r", [1, 2, 3], 64, Family("f")), picked(3), 5.0)
    assert (result.cached_blocks, result.confirmed) == (1, True)
