"""Write capabilities (services/common/capability.py), the kvstore's gate
that mints and checks them (write_gate.py) and the registry of where
replicas may go (peers.py)."""
from __future__ import annotations

import threading

import pytest

from speckv.services.common import capability as capability_module
from speckv.services.common.capability import Capability, CapabilityKey
from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import PermissionDenied, Unavailable
from speckv.services.kvstore.peers import RegisteredPeers
from speckv.services.kvstore.reservations import Grant, Handle
from speckv.services.kvstore.write_gate import WriteGate

CLAIMS = Capability("r-1-abc", "order-7", "node-a", "node-b", 0, 4096, 1_000.0)


def test_a_signed_capability_verifies_with_its_claims():
    key = CapabilityKey()
    token = key.sign(CLAIMS)
    assert key.verify(token, 999.0, handle="r-1-abc", offset=1024, size=3072) == CLAIMS


def test_it_expires():
    key = CapabilityKey()
    token = key.sign(CLAIMS)
    with pytest.raises(PermissionDenied, match="expired"):
        key.verify(token, 1_000.0, handle="r-1-abc")


def test_every_single_bit_flip_is_refused():
    key = CapabilityKey()
    token = key.sign(CLAIMS)
    for i in range(len(token)):
        for bit in (0, 7):
            forged = bytearray(token)
            forged[i] ^= 1 << bit
            with pytest.raises(PermissionDenied):
                key.verify(bytes(forged), 0.0, handle="r-1-abc")


def test_claims_changed_and_re_encoded_do_not_verify_under_the_old_tag():
    key = CapabilityKey()
    tag = key.sign(CLAIMS)[-capability_module.TAG_BYTES:]
    wider = Capability("r-1-abc", "order-7", "node-a", "node-b", 0, 1 << 40, 1e12)
    with pytest.raises(PermissionDenied, match="not valid"):
        key.verify(wider.encode_claims() + tag, 0.0, handle="r-1-abc")


def test_another_nodes_key_does_not_verify_it():
    with pytest.raises(PermissionDenied, match="not valid"):
        CapabilityKey().verify(CapabilityKey().sign(CLAIMS), 0.0, handle="r-1-abc")


@pytest.mark.parametrize("token", [b"", b"x", b"\x00" * 60, b"\x01" * (capability_module.MAX_TOKEN_BYTES + 1)])
def test_missing_short_or_oversized_tokens_are_refused(token):
    with pytest.raises(PermissionDenied):
        CapabilityKey().verify(token, 0.0, handle="r-1-abc")


def test_it_names_one_reservation_and_one_range():
    key = CapabilityKey()
    token = key.sign(CLAIMS)
    with pytest.raises(PermissionDenied, match="for reservation r-1-abc"):
        key.verify(token, 0.0, handle="r-2-def")
    with pytest.raises(PermissionDenied, match="outside"):
        key.verify(token, 0.0, handle="r-1-abc", offset=4000, size=100)


def test_the_tag_is_compared_in_constant_time(monkeypatch):
    calls = []

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return a == b

    key = CapabilityKey()
    token = key.sign(CLAIMS)
    monkeypatch.setattr(capability_module.hmac, "compare_digest", spy)
    key.verify(token, 0.0, handle="r-1-abc")
    assert len(calls) == 1 and calls[0][1] == token[-capability_module.TAG_BYTES:]


def test_keys_must_be_long_enough():
    with pytest.raises(ValueError):
        CapabilityKey(b"short")


def test_the_gate_mints_for_the_whole_reservation_until_its_ttl():
    clock = ManualClock(100.0)
    gate = WriteGate("node-b", clock, ttl_s=5.0)
    grant = Grant(Handle("r-1-x"), (1, 2, 3), 1024, 110.0)
    token = gate.mint(grant, "o-1", "node-a")
    capability = gate.check(token, "r-1-x", 2048, 1024)
    assert (capability.source_node, capability.target_node, capability.lo, capability.hi) == ("node-a", "node-b", 0,
                                                                                              3072)
    gate.still_covers(capability, "r-1-x", 0, 3072)
    with pytest.raises(PermissionDenied, match="outside"):
        gate.still_covers(capability, "r-1-x", 2048, 2048)
    clock.advance(5.0)
    with pytest.raises(PermissionDenied, match="expired"):
        gate.still_covers(capability, "r-1-x", 0, 1024)
    with pytest.raises(PermissionDenied, match="expired"):
        gate.check(token, "r-1-x")


class _Registry:
    def __init__(self, nodes: dict[str, str]) -> None:
        self.nodes, self.calls = nodes, 0

    def __call__(self) -> dict[str, str]:
        self.calls += 1
        return dict(self.nodes)


def test_peers_accept_only_registered_addresses_and_refresh_at_most_once_a_second():
    clock = ManualClock(0.0)
    registry = _Registry({"node-b": "127.0.0.1:5001"})
    peers = RegisteredPeers(registry, clock)
    peers.check("node-b", "127.0.0.1:5001")
    peers.check("", "127.0.0.1:5001")
    with pytest.raises(PermissionDenied, match="not a registered node's registered address"):
        peers.check("node-b", "127.0.0.1:6000")
    with pytest.raises(PermissionDenied):
        peers.check("node-x", "127.0.0.1:5001")
    assert registry.calls == 1  # the misses within the second asked no more
    registry.nodes["node-c"] = "127.0.0.1:5002"
    clock.advance(1.0)
    peers.check("node-c", "127.0.0.1:5002")  # a miss after a second refreshes
    assert registry.calls == 2


def test_a_check_during_a_refresh_waits_for_it_instead_of_refusing():
    """Two orders sent together to two peers: the second's miss comes while
    the first's fetch runs, and must see what that fetch brings."""
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow_registry() -> dict[str, str]:
        calls.append(1)
        started.set()
        assert release.wait(10.0)
        return {"node-b": "127.0.0.1:5001", "node-c": "127.0.0.1:5002"}

    peers = RegisteredPeers(slow_registry, ManualClock(0.0))
    first = threading.Thread(target=peers.check, args=("node-b", "127.0.0.1:5001"))
    first.start()
    assert started.wait(10.0)
    outcome: list[BaseException | None] = []
    second = threading.Thread(target=lambda: outcome.append(_raised(peers.check, "node-c", "127.0.0.1:5002")))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting on the fetch, not refused
    release.set()
    first.join(10.0), second.join(10.0)
    assert outcome == [None] and len(calls) == 1


def _raised(call, *args) -> BaseException | None:
    try:
        call(*args)
    except BaseException as exc:  # noqa: BLE001 - the test reports whatever it was
        return exc
    return None


def test_without_a_registry_no_target_is_allowed():
    with pytest.raises(PermissionDenied, match="no scheduler"):
        RegisteredPeers(None, ManualClock(0.0)).check("node-b", "127.0.0.1:5001")


def test_an_unreachable_registry_is_unavailable():
    def down() -> dict[str, str]:
        raise Unavailable("scheduler down")

    with pytest.raises(Unavailable):
        RegisteredPeers(down, ManualClock(0.0)).check("node-b", "127.0.0.1:5001")


def test_a_data_address_must_be_on_the_registered_host():
    RegisteredPeers.check_data_address("10.0.0.2:5001", "10.0.0.2:7000")
    with pytest.raises(PermissionDenied, match="not on its registered host"):
        RegisteredPeers.check_data_address("10.0.0.2:5001", "10.0.0.9:7000")
