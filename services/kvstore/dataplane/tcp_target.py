"""ReplicationTarget over the bulk TCP data plane: Reserve, Commit and Abort
stay on gRPC (GrpcReplicationTarget); the chunks go over one dedicated TCP
connection per order to the data address the target advertised in its
ReserveResponse, framed as in services/kvstore/dataplane/wire.py. Not core: it owns
sockets.

Per chunk: pace against the node's link cap (token bucket, if any), send the
header and the payload in one sendmsg, gathering the payload straight from
the source pool's segment views (zero-copy chunks) or the staging buffer
(packed chunks, e.g. from a GPU pool); peek for an early error reply from the target so a refused chunk stops
the transfer at once. At the end, an END frame and the target's reply confirm
that every byte landed before the source commits. When the target's Reserve
returned a write capability, the target's challenge is read first and an
AUTH frame carrying the capability and the proof of its secret over the
challenge's nonce goes first; every chunk then carries its MAC tag
(dataplane/possession.py), computed on a tagging thread while the chunk's
payload is sent and sent itself ahead of the next frame (dataplane/tagger.py;
the bytes on the wire are the same).

A target without a data address (its transport is grpc) gets the chunks over
WriteChunks instead: the fallback.
"""
from __future__ import annotations

import select
import socket
import time
from typing import Iterator, Mapping

from speckv.services.common import errors
from speckv.services.kvstore.dataplane import possession, wire
from speckv.services.kvstore.dataplane.listener import tune
from speckv.services.kvstore.dataplane.tagger import AHEAD_MIN_BYTES, Tagger
from speckv.services.kvstore.token_bucket import TokenBucket
from speckv.services.kvstore.grpc_target import GrpcReplicationTarget
from speckv.services.kvstore.replication import Chunk, TransferOrder
from speckv.services.kvstore.reservations import Grant


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise errors.FailedPrecondition(f"data address {address!r} is not host:port")
    return host.strip("[]"), int(port)


class TcpReplicationTarget:
    def __init__(self, control: GrpcReplicationTarget, *, timeout_s: float = 10.0,
                 bucket: TokenBucket | None = None) -> None:
        self._control = control
        self._timeout_s = timeout_s
        self._bucket = bucket
        self._data_address = ""
        self._capability = b""
        self._secret = b""
        self.transport = "tcp"

    @property
    def zero_copy(self) -> bool:
        """Chunks given as views go out with sendmsg; the gRPC fallback needs bytes."""
        return bool(self._data_address)

    def reserve(self, order: TransferOrder, lease_s: float) -> Grant:
        grant = self._control.reserve(order, lease_s)
        self._data_address = grant.data_address
        self._capability = grant.capability
        self._secret = grant.secret
        self.transport = "tcp" if grant.data_address else "grpc"
        return grant

    def write_chunks(self, handle: str, chunks: Iterator[Chunk], total_bytes: int) -> int:
        if not self._data_address:
            return self._control.write_chunks(handle, chunks, total_bytes)
        where = f"target {self._control.address} data plane {self._data_address}"
        try:
            sock = socket.create_connection(split_address(self._data_address), timeout=self._timeout_s)
        except OSError as exc:
            raise errors.Unavailable(f"{where}: cannot connect: {exc}") from None
        try:
            tune(sock)
            return self._send(sock, handle.encode("utf-8"), chunks, where)
        finally:
            sock.close()

    def _send(self, sock: socket.socket, handle: bytes, chunks: Iterator[Chunk], where: str) -> int:
        header, poller = wire.header_buffer(), select.poll()
        poller.register(sock, select.POLLIN)
        tagger = Tagger("data-tag")
        try:
            key = self._authenticate(sock, header, handle) if self._capability else b""
            name = handle.decode("utf-8")
            carried: list[memoryview] = []  # the previous chunk's tag, sent ahead of the next frame
            for chunk in chunks:
                size = chunk.nbytes
                self._pace(size)
                head = wire.encode_header(header, wire.Kind.CHUNK, handle, chunk.offset, size, chunk.crc32c)
                pieces = chunk.pieces or (memoryview(chunk.data).cast("B"),)
                views, total = [*carried, head, *pieces], len(carried) * possession.TAG_BYTES + len(head) + size
                carried = []
                if not key:
                    wire.send_views(sock, views, total)
                elif size < AHEAD_MIN_BYTES:
                    mac = possession.ChunkMac(key, name, chunk.offset, size, chunk.crc32c)
                    for piece in pieces:
                        mac.update(piece)
                    wire.send_views(sock, [*views, memoryview(mac.tag())], total + possession.TAG_BYTES)
                else:  # the tag is computed while the payload goes out (tagger.py)
                    tagger.start(possession.ChunkMac(key, name, chunk.offset, size, chunk.crc32c), pieces)
                    wire.send_views(sock, views, total)
                    carried = [memoryview(tagger.tag())]
                if _readable(poller):
                    break  # the target answered early: an error; read it below
            else:
                end = wire.encode_header(header, wire.Kind.END, handle, 0, 0, 0)
                wire.send_views(sock, [*carried, end], len(carried) * possession.TAG_BYTES + len(end))
            reply = wire.read_reply(sock)
        except errors.SpeckvError as exc:
            raise type(exc)(f"{where}: {exc}") from None
        except OSError as exc:
            raise errors.Unavailable(f"{where}: connection lost: {exc}") from None
        finally:
            tagger.close()
        reply.raise_for_status(where)
        return reply.bytes_received

    def _authenticate(self, sock: socket.socket, header: bytearray, handle: bytes) -> bytes:
        """Reads the target's challenge and sends AUTH: the capability and the
        proof of its secret over the challenge's nonce; returns the chunks'
        MAC key. A refusal the target sent instead is raised."""
        head = bytearray(4)
        wire.recv_exact(sock, memoryview(head))
        if bytes(head) == wire.REPLY_MAGIC:  # refused before any challenge (e.g. too many connections)
            rest = bytearray(wire.REPLY.size - 4)
            wire.recv_exact(sock, memoryview(rest))
            _, status, received, text_len = wire.REPLY.unpack(bytes(head + rest))
            text = bytearray(min(text_len, wire.MAX_MESSAGE_BYTES))
            wire.recv_exact(sock, memoryview(text))
            wire.Reply(status, received, text.decode("utf-8", errors="replace")).raise_for_status("refused")
        tail = bytearray(possession.CHALLENGE.size - 4)
        wire.recv_exact(sock, memoryview(tail))
        try:
            nonce = possession.read_challenge(bytes(head + tail))
        except ValueError as exc:
            raise errors.Unavailable(f"data plane: {exc}") from None
        name = handle.decode("utf-8")
        payload = self._capability + possession.proof(self._secret, nonce, name)
        wire.send_views(sock, [wire.encode_header(header, wire.Kind.AUTH, handle, 0, len(payload), 0),
                               memoryview(payload)])
        return possession.chunk_key(self._secret, nonce, name)

    def _pace(self, nbytes: int) -> None:
        if self._bucket is not None:
            wait = self._bucket.take(nbytes)
            if wait > 0:
                time.sleep(wait)

    def commit(self, handle: str, chunk_crcs: Mapping[int, int], replica_lease_s: float) -> int:
        return self._control.commit(handle, chunk_crcs, replica_lease_s)

    def abort(self, handle: str, reason: str) -> None:
        self._control.abort(handle, reason)

    def close(self) -> None:
        self._control.close()


def _readable(poller: select.poll) -> bool:
    """Whether the target has sent anything (or closed) yet: only errors come
    unasked. A zero-timeout poll: the socket itself is in timeout mode, so a
    non-blocking recv would wait."""
    return bool(poller.poll(0))
