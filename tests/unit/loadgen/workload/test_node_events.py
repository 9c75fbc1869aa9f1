"""The node event sets: the committed file, resolution at the peak, and clear errors."""
import json

import pytest

from speckv.loadgen.workload.node_events import (
    MOST_KV,
    EventKind,
    get_event_set,
    load_event_sets,
    peak_start_s,
    resolve,
)
from speckv.services.common.errors import InvalidArgument, NotFound


def test_the_committed_sets_include_the_two_the_issue_names():
    sets = load_event_sets()
    assert sets["kill-busiest-at-peak"][0].kind is EventKind.KILL and sets["kill-busiest-at-peak"][0].node == MOST_KV
    assert sets["add-at-peak"][0].kind is EventKind.ADD and sets["add-at-peak"][0].at == "peak"


def test_the_peak_is_the_busiest_minute():
    arrivals = [float(t) for t in range(0, 300, 5)] + [100.0 + 0.1 * i for i in range(50)]
    assert peak_start_s(arrivals) == 45.0  # the first whole-second window holding all of 100-105 and most else
    assert peak_start_s([3.5]) == 3.0


def test_resolve_places_events_in_time_order_with_their_delay():
    arrivals = [float(t) for t in range(0, 600)] + [300.0] * 100
    events = resolve(get_event_set("replace-busiest-at-peak"), arrivals, "replace-busiest-at-peak")
    assert [e.kind for e in events] == [EventKind.KILL, EventKind.ADD]
    assert events[1].at_s - events[0].at_s == 30.0 and 241.0 <= events[0].at_s <= 300.0


def write(tmp_path, table):
    path = tmp_path / "events.json"
    path.write_text(json.dumps({"events": table}))
    return path


def test_a_time_outside_the_slice_is_refused(tmp_path):
    path = write(tmp_path, {"late": {"events": [{"kind": "kill", "at": 5000, "node": "node-0"}]}})
    with pytest.raises(InvalidArgument, match="outside the replayed slice"):
        resolve(get_event_set("late", path), [0.0, 100.0], "late")


def test_an_unknown_set_names_the_known_ones():
    with pytest.raises(NotFound, match="kill-busiest-at-peak"):
        get_event_set("no-such-set")


@pytest.mark.parametrize("event,match", [
    ({"kind": "explode"}, "kind must be"),
    ({"kind": "kill", "at": "noon"}, "at must be"),
    ({"kind": "kill", "after_s": -1}, "after_s"),
    ({"kind": "add", "node": "node-1"}, "names no node"),
    ({"kind": "kill", "node": ""}, "a kill's node"),
    ({"kind": "kill", "when": 3}, "unknown key"),
])
def test_bad_events_get_clear_errors(tmp_path, event, match):
    with pytest.raises(InvalidArgument, match=match):
        load_event_sets(write(tmp_path, {"bad": {"events": [event]}}))


def test_an_unreadable_file_is_named(tmp_path):
    path = tmp_path / "events.json"
    path.write_text("{not json")
    with pytest.raises(InvalidArgument, match=str(path)):
        load_event_sets(path)
