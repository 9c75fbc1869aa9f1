"""The table of unauthenticated data connections (admission.py): its caps,
its deadline, and who is displaced when it is full; `now` is passed in, so
time is exact."""
from __future__ import annotations

import pytest

from speckv.services.kvstore.dataplane.admission import Admission, ConnId, Refusal, UnauthTable

A, B, C, D = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"


def fill(table: UnauthTable, rows: list[tuple[int, str]], now: float = 0.0) -> list[Admission]:
    return [table.admit(ConnId(conn), address, now) for conn, address in rows]


def test_one_address_gets_per_address_rows_and_the_next_is_refused_at_once():
    table = UnauthTable(capacity=10, per_address=3, deadline_s=1.0)
    assert all(a.admitted for a in fill(table, [(1, A), (2, A), (3, A)]))
    assert table.admit(ConnId(4), A, 0.0) == Admission(False, Refusal.PER_ADDRESS)
    assert table.admit(ConnId(5), B, 0.0).admitted  # another address is not held back
    assert table.settle(ConnId(1)) and table.admit(ConnId(6), A, 0.0).admitted  # a settled row comes back
    assert table.counts.refused_per_address == 1 and len(table) == 4


def test_a_full_table_admits_a_new_address_by_displacing_the_oldest_row_of_the_busiest():
    table = UnauthTable(capacity=4, per_address=4, deadline_s=1.0)
    fill(table, [(1, B), (2, A), (3, A), (4, A)])
    admission = table.admit(ConnId(5), C, 0.0)
    assert admission == Admission(True, None, ConnId(2))  # A's oldest, not B's older single row
    assert ConnId(2) not in table and ConnId(1) in table and table.held_by(A) == 2
    assert table.counts.displaced == 1 and len(table) == 4


def test_a_full_table_refuses_a_newcomer_whose_address_is_already_the_busiest():
    table = UnauthTable(capacity=4, per_address=4, deadline_s=1.0)
    fill(table, [(1, A), (2, A), (3, B), (4, C)])
    assert table.admit(ConnId(5), A, 0.0) == Admission(False, Refusal.FULL)
    assert table.admit(ConnId(6), B, 0.0).displaced == ConnId(1)  # B holds 1 < A's 2: A's oldest goes
    assert table.admit(ConnId(7), B, 0.0) == Admission(False, Refusal.FULL)  # B is the busiest now (2; A 1, C 1)
    assert table.counts.refused_full == 2


def test_among_tied_busiest_addresses_the_longest_waiting_row_is_displaced():
    table = UnauthTable(capacity=4, per_address=4, deadline_s=1.0)
    fill(table, [(1, A), (2, B), (3, B), (4, A)])
    assert table.admit(ConnId(5), C, 0.0).displaced == ConnId(1)  # A and B hold 2 each; 1 came first
    assert table.admit(ConnId(6), D, 0.0).displaced == ConnId(2)  # B is the busiest now


def test_a_single_row_is_never_displaced_while_another_address_holds_two():
    table = UnauthTable(capacity=3, per_address=3, deadline_s=1.0)
    fill(table, [(1, C), (2, A), (3, A)])  # C is the rightful sender, its row the oldest
    for conn in range(4, 40):  # a flood from A and B in turn
        table.admit(ConnId(conn), A if conn % 2 else B, 0.0)
        assert ConnId(1) in table


def test_rows_expire_at_their_deadline_oldest_first_and_only_once():
    table = UnauthTable(capacity=10, per_address=10, deadline_s=1.0)
    table.admit(ConnId(1), A, 0.0)
    table.admit(ConnId(2), B, 0.5)
    assert table.next_deadline() == 1.0
    assert table.expire(0.999) == []
    assert table.expire(1.0) == [ConnId(1)]  # at the deadline, not after it
    assert table.next_deadline() == 1.5 and not table.settle(ConnId(1))
    assert table.expire(10.0) == [ConnId(2)] and table.expire(10.0) == []
    assert table.next_deadline() is None and table.counts.timed_out == 2 and table.held_by(A) == 0


@pytest.mark.parametrize("capacity, per_address, deadline_s", [(0, 1, 1.0), (1, 0, 1.0), (1, 1, 0.0)])
def test_bad_bounds_are_refused(capacity, per_address, deadline_s):
    with pytest.raises(ValueError):
        UnauthTable(capacity, per_address, deadline_s)
