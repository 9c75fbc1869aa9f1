"""Chaos area `dataplane`: writes that must prove a capability, replicas
whose bytes must match the source's checksums, and a pre-seeded hash that
must keep its bytes (docs/security.md, "The data plane")."""
from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import grpc

from speckv.loadgen.bench.chaos.common import TIMEOUT, block_bytes, intact, order, put, stats
from speckv.loadgen.bench.chaos.report import Verdict, expect_code
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.dataplane import possession, wire
from speckv.services.kvstore.dataplane.tcp_target import split_address
from speckv.v1 import common_pb2, kvstore_pb2

if TYPE_CHECKING:
    from speckv.loadgen.bench.chaos.cli import Context

AREA = "dataplane"
WIRE_PERMISSION_DENIED = 7  # the gRPC code number, on the data plane's wire
WIRE_ABORTED = 10
SEEDED = [7_200_001, 7_200_002]


class RawWriter:
    """An attacker's (or a careful writer's) raw data plane connection to a
    reservation's data address. A protected target (the grant has a
    capability) first sends a challenge: its nonce is read at connect."""

    def __init__(self, grant: kvstore_pb2.ReserveResponse) -> None:
        self.sock = socket.create_connection(split_address(grant.data_address), timeout=TIMEOUT)
        self.handle = grant.handle.encode()
        self.nonce = read_challenge(self.sock) if grant.capability else b""
        self.key = b""

    def auth(self, token: bytes, secret: bytes = b"", proof: bytes | None = None) -> None:
        """AUTH with token and the proof of secret over this connection's
        nonce (proof: the 32 bytes to send instead, e.g. a replayed one);
        later chunks carry their MAC under the secret's key."""
        if proof is None:
            proof = possession.proof(secret, self.nonce, self.handle.decode()) if secret else b"\x00" * 32
        if secret:
            self.key = possession.chunk_key(secret, self.nonce, self.handle.decode())
        self.last_proof = proof
        payload = token + proof
        self.sock.sendall(wire.encode_header(wire.header_buffer(), wire.Kind.AUTH, self.handle, 0, len(payload), 0))
        self.sock.sendall(payload)

    def chunk(self, offset: int, data: bytes, crc: int | None = None, mac_over: bytes | None = None) -> None:
        """crc: the checksum the header claims (default: the data's own);
        mac_over: the bytes the tag is computed over (default: data; others
        play bytes changed in flight after the writer MACed them)."""
        crc = crc32c(data) if crc is None else crc
        self.sock.sendall(wire.encode_header(wire.header_buffer(), wire.Kind.CHUNK, self.handle, offset, len(data),
                                             crc))
        self.sock.sendall(data)
        if self.key:
            mac = possession.ChunkMac(self.key, self.handle.decode(), offset, len(data), crc)
            mac.update(data if mac_over is None else mac_over)
            self.sock.sendall(mac.tag())

    def end(self) -> wire.Reply:
        self.sock.sendall(wire.encode_header(wire.header_buffer(), wire.Kind.END, self.handle, 0, 0, 0))
        return wire.read_reply(self.sock)

    def reply(self) -> wire.Reply:
        return wire.read_reply(self.sock)

    def close(self) -> None:
        self.sock.close()


def read_challenge(sock: socket.socket) -> bytes:
    """The nonce a protected target sends a connection first."""
    raw = bytearray(possession.CHALLENGE.size)
    wire.recv_exact(sock, memoryview(raw))
    return possession.read_challenge(bytes(raw))


def skip_challenge(sock: socket.socket) -> None:
    """Consumes a challenge if the target sent one (protected), so the next
    read is its reply."""
    if sock.recv(4, socket.MSG_PEEK | socket.MSG_WAITALL) == possession.CHALLENGE_MAGIC:
        read_challenge(sock)


def run(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    target = cluster.kvstore("node-2")
    put(target, SEEDED)
    next_id = iter(range(1, 1_000))

    def reserve(hashes: list[int]) -> kvstore_pb2.ReserveResponse:
        return target.Reserve(kvstore_pb2.ReserveRequest(
            order_id=f"o-chaos-dp-{next(next_id)}", block_hashes=hashes, source_node="node-0", family="chaos",
            lease_ms=30_000), timeout=TIMEOUT)

    def published(hashes: list[int]) -> bool:
        return any(target.Lookup(kvstore_pb2.LookupRequest(block_hashes=hashes), timeout=TIMEOUT).present)

    def tcp_write(token: bytes | None, make_token=None) -> Verdict:
        hashes = [7_300_000 + next(next_id)]
        grant = reserve(hashes)
        if make_token is not None:
            token = make_token(grant)
        data = b"\xee" * len(block_bytes(hashes[0]))
        writer = RawWriter(grant)
        try:
            if token is not None:
                writer.auth(token)
            writer.chunk(0, data, crc32c(data))
            reply = writer.reply()
        finally:
            writer.close()
        reserved = stats(target).reserved_pages
        target.Abort(kvstore_pb2.AbortRequest(handle=grant.handle, capability=grant.capability,
                                              capability_secret=grant.capability_secret), timeout=TIMEOUT)
        ok = reply.status == WIRE_PERMISSION_DENIED and reserved >= 1 and not published(hashes)
        return Verdict(ok, f"wire status {reply.status} ({reply.message[:80]}); reservation kept: {reserved >= 1}; "
                           f"published: {published(hashes)}")

    def flipped(grant: kvstore_pb2.ReserveResponse) -> bytes:
        token = bytearray(grant.capability)
        token[-1] ^= 0x01
        return bytes(token)

    expected = "wire PERMISSION_DENIED before the store is asked; the reservation intact; nothing published"
    rec.case(AREA, "TCP chunk with no capability", expected, lambda: tcp_write(None))
    rec.case(AREA, "TCP chunk with a forged capability (one bit)", expected, lambda: tcp_write(None, flipped))
    other = reserve([7_399_999])
    rec.case(AREA, "TCP chunk with another reservation's capability", expected,
             lambda: tcp_write(other.capability))
    rec.case(AREA, "TCP chunk with 80 bytes of garbage as capability", expected, lambda: tcp_write(b"\x01" * 80))
    target.Abort(kvstore_pb2.AbortRequest(handle=other.handle, capability=other.capability,
                                          capability_secret=other.capability_secret), timeout=TIMEOUT)

    def grpc_without_capability(what: str) -> Verdict:
        hashes = [7_400_000 + next(next_id)]
        grant = reserve(hashes)
        data = block_bytes(hashes[0])
        calls = {
            "WriteChunks": lambda: target.WriteChunks(iter([kvstore_pb2.WriteChunkRequest(
                handle=grant.handle, offset=0, data=data, crc32c=crc32c(data))]), timeout=TIMEOUT),
            "Commit": lambda: target.Commit(kvstore_pb2.CommitRequest(handle=grant.handle,
                                                                      chunk_crc32c={0: crc32c(data)}), timeout=TIMEOUT),
            "Abort": lambda: target.Abort(kvstore_pb2.AbortRequest(handle=grant.handle, reason="attacker"),
                                          timeout=TIMEOUT),
            "Abort with a sniffed capability": lambda: target.Abort(kvstore_pb2.AbortRequest(
                handle=grant.handle, reason="attacker", capability=grant.capability), timeout=TIMEOUT),
        }
        verdict = expect_code(calls[what], grpc.StatusCode.PERMISSION_DENIED)
        kept = stats(target).reserved_pages >= 1
        target.Abort(kvstore_pb2.AbortRequest(handle=grant.handle, capability=grant.capability,
                                              capability_secret=grant.capability_secret), timeout=TIMEOUT)
        return Verdict(verdict.ok and kept, f"{verdict.observed}; reservation kept: {kept}")

    for what in ("WriteChunks", "Commit", "Abort"):
        rec.case(AREA, f"gRPC {what} without the capability (drop someone's transfer)",
                 "PERMISSION_DENIED; the reservation intact", lambda what=what: grpc_without_capability(what))
    rec.case(AREA, "gRPC Abort with a capability sniffed off the data plane, without its secret (issue 43)",
             "PERMISSION_DENIED; the reservation intact",
             lambda: grpc_without_capability("Abort with a sniffed capability"))

    def bytes_flipped(fix_crc: bool) -> Verdict:
        hashes = [7_500_000 + next(next_id), 7_500_500 + next(next_id)]
        data = b"".join(block_bytes(h) for h in hashes)
        bad = bytearray(data)
        bad[100] ^= 0x40
        grant = reserve(hashes)
        writer = RawWriter(grant)
        try:
            writer.auth(grant.capability, grant.capability_secret)
            # The writer MACed its own bytes and crc; the flip (and the crc rewrite) happen after it.
            writer.chunk(0, bytes(bad), crc32c(bytes(bad)) if fix_crc else crc32c(data), mac_over=data)
            reply = writer.reply()
        finally:
            writer.close()
        freed = stats(target).reserved_pages == 0
        ok = reply.status == WIRE_PERMISSION_DENIED and "MAC" in reply.message and not published(hashes)
        return Verdict(ok, f"wire status {reply.status} ({reply.message[:60]}); reservation aborted: {freed}; "
                           f"published: {published(hashes)}")

    expected = "the chunk fails its MAC (wire PERMISSION_DENIED), the reservation is aborted; nothing published"
    rec.case(AREA, "a flipped byte in flight, chunk crc kept", expected, lambda: bytes_flipped(False))
    rec.case(AREA, "a flipped byte in flight, chunk crc rewritten to match", expected, lambda: bytes_flipped(True))

    def replayed_auth() -> Verdict:
        """Issue 43: a sniffed AUTH frame replayed on a new connection, or the
        token without its secret, proves nothing; the rightful writer goes on."""
        hashes = [7_550_000 + next(next_id)]
        data = block_bytes(hashes[0])
        grant = reserve(hashes)
        rightful = RawWriter(grant)
        rightful.auth(grant.capability, grant.capability_secret)
        statuses = []
        for proof in (rightful.last_proof, None):  # sniffed proof; no secret at all
            sniffer = RawWriter(grant)
            sniffer.auth(grant.capability, proof=proof)
            sniffer.chunk(0, b"\xee" * len(data))
            statuses.append(sniffer.reply().status)
            sniffer.close()
        rightful.chunk(0, data)
        landed = rightful.end().bytes_received == len(data)
        rightful.close()
        commit = kvstore_pb2.CommitRequest(handle=grant.handle, chunk_crc32c={0: crc32c(data)},
                                           capability=grant.capability,
                                           capability_secret=grant.capability_secret)
        committed = target.Commit(commit, timeout=TIMEOUT).blocks_committed == 1
        held, what = intact(target, hashes)
        ok = statuses == [WIRE_PERMISSION_DENIED] * 2 and landed and committed and held
        return Verdict(ok, f"replayed AUTH / token alone: wire {statuses}; the rightful writer's chunk landed: "
                           f"{landed}, committed: {committed}; {what}")

    rec.case(AREA, "a sniffed AUTH frame replayed on another connection; the token without its secret",
             "wire PERMISSION_DENIED (no proof over the new nonce); the rightful transfer commits byte for byte",
             replayed_auth)

    def overwrite() -> Verdict:
        # as the admin: even an identity that may PutBlocks on node-2 cannot replace what it holds
        # (another node may not PutBlocks there at all: identity area, issue 43 item 3)
        evil = put(cluster.kvstore("node-2"), SEEDED, data=lambda h: b"\xee" * len(block_bytes(h)))
        held, what = intact(target, SEEDED)
        return Verdict(held and evil.stored == 0, f"stored {evil.stored}, already present {evil.already_present}; "
                                                  f"{what}")

    rec.case(AREA, "PutBlocks of other bytes over an existing hash (as the admin)", "existing hashes kept as is (stored 0)",
             overwrite)

    def replicate_ok() -> Verdict:
        source = cluster.kvstore("node-0")
        hashes = [7_600_001, 7_600_002, 7_600_003]
        put(source, hashes)
        registered = cluster.services["node-2"].address
        request = kvstore_pb2.ReplicateRequest(order=order("node-0", "node-2", registered, hashes, "o-chaos-ok"))
        reply = source.Replicate(request, timeout=TIMEOUT)
        held, what = intact(target, hashes)
        ok = reply.state == common_pb2.ORDER_STATE_COMMITTED and held
        return Verdict(ok, f"{common_pb2.OrderState.Name(reply.state)}, {reply.blocks_sent} blocks over "
                           f"{reply.transport}; {what}")

    rec.case(AREA, "the admin's Replicate to a registered node (protection on)",
             "COMMITTED, byte for byte: the protection does not stop the rightful path", replicate_ok)

