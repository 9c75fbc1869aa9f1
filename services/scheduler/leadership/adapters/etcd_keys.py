"""EtcdKeys: keys.py's LeaderKeyStore and FencedKeyStore on a real etcd v3
(3.4+), through its gRPC gateway's JSON API with etcd3gw.

- Several members (etcd_endpoints.py): each call goes to the member that
  answered last and, when that one fails (refused, reset, timed out, TLS
  refused, or an etcd-side unavailability: 5xx, such as "no leader" on a
  member cut off from the quorum), to the next, each within `timeout_s`,
  until one answers. Any member is as good as another: etcd forwards writes
  and lease calls to its raft leader and serves linearizable reads, so the
  election's and the store's semantics do not depend on the member asked.
  Every call is safe to repeat on another member: grant (a lease granted
  twice leaves one unused, which expires with its TTL), keep-alive, revoke,
  range, and the two txns, whose outcome a repeat reports (a campaign
  repeated finds its own key; a fenced write repeated puts the same values).
- An answer that says the request itself is wrong (4xx, such as "lease not
  found") is the cluster's, not a member's: no other member is asked.
- When no member answers, Unavailable names each member's failure; the
  election and the state store treat it as "etcd unreachable now". A fenced
  write that a later member refused after an earlier member failed may have
  been applied by that earlier one: Unavailable too (outcome unknown), never
  "not applied".
- Calls time out after `timeout_s` per member (keep it under a lease round,
  TTL/3, so a round never blocks past the lead's valid-until for long);
  `read_prefix`, which may carry the whole order log, after `read_timeout_s`.
- read_prefix reads in pages of READ_PAGE keys, every page at the revision
  of the first, so the result is one consistent snapshot however large.
- One HTTP session per thread and member (the elector's and the scheduler's
  threads call concurrently; requests' sessions are not documented
  thread-safe).
- TLS: https members with `tls` (etcd_endpoints.EtcdTls): the CA checks the
  member's certificate, the client certificate proves this client.
- watch (keys.LeaderKeyWatch): one streaming /v3/watch request at a time
  on the calling thread, on the member that answered last, reopened every
  `WATCH_IDLE_S` without news (an idle stream says nothing, so that bounds
  how long a stopped watch lingers) and after a failure, on the next member,
  WATCH_RETRY_S after the last stream ended either way. A stream reopened resumes at the revision after the
  last one it saw (etcd replays what happened between), so nothing is
  missed across members; a fresh start or a resume etcd refuses (compacted)
  reports a change, since one may have been missed.
- The gateway's JSON: int64 fields are strings, fields at their default
  (0, false, empty) are omitted, keys and values are base64.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Any, Callable, Mapping, Sequence

from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception, InternalServerError
from etcd3gw.utils import _decode, _encode as _b64

from speckv.services.common.errors import Unavailable
from speckv.services.scheduler.leadership.adapters.etcd_endpoints import (
    Endpoint, EtcdTls, parse_endpoint, parse_endpoints)
from speckv.services.scheduler.leadership.keys import CampaignResult, KeyRecord, LeaseId

log = logging.getLogger(__name__)

API_PATH = "/v3/"  # etcd >= 3.4 (no discovery round trip)
READ_PAGE = 1000
DEFAULT_TIMEOUT_S = 0.5
DEFAULT_READ_TIMEOUT_S = 10.0
WATCH_IDLE_S = 5.0
WATCH_RETRY_S = 0.2


# A member that fails this way may be alone in it: ask the next. (etcd3gw raises ConnectionFailedError for
# a refused, reset or TLS-refused connection and for HTTP 503, ConnectionTimeoutError for a timeout and for
# 408/504, InternalServerError for 500; a plain Etcd3Exception is any other answer that is not 200.)
MEMBER_FAILURES = (ConnectionFailedError, ConnectionTimeoutError, InternalServerError)

__all__ = ["EtcdKeys", "Endpoint", "EtcdTls", "parse_endpoint", "parse_endpoints"]


class EtcdKeys:
    """endpoints: one etcd cluster's members, comma-separated or a list (etcd_endpoints.py)."""

    def __init__(self, endpoints: str | Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, tls: EtcdTls | None = None) -> None:
        self.members = parse_endpoints(endpoints, tls)
        self.endpoint = ",".join(m.url for m in self.members)
        self._tls = tls or EtcdTls()
        self._timeout_s, self._read_timeout_s = timeout_s, read_timeout_s
        self._local = threading.local()
        self._preferred = 0  # the member that answered last (an index; a plain int is swapped atomically)

    # --- LeaderKeyStore ------------------------------------------------------
    def grant(self, ttl_s: int) -> tuple[LeaseId, int]:
        reply = self._post("lease/grant", {"TTL": ttl_s, "ID": 0})
        return int(reply["ID"]), int(reply.get("TTL", ttl_s))

    def keep_alive(self, lease: LeaseId) -> int:
        reply = self._post("lease/keepalive", {"ID": lease})
        result = reply.get("result", {})
        return int(result.get("TTL", -1)) if isinstance(result, dict) else -1

    def revoke(self, lease: LeaseId) -> None:
        try:
            self._post("lease/revoke", {"ID": lease})
        except Unavailable as exc:
            if "lease not found" not in str(exc):
                raise

    def read(self, key: str) -> KeyRecord | None:
        kvs = self._post("kv/range", {"key": _encode(key)}).get("kvs", [])
        return _record(kvs[0]) if kvs else None

    def campaign(self, key: str, value: bytes, lease: LeaseId) -> CampaignResult:
        k = _encode(key)
        read = {"request_range": {"key": k}}
        reply = self._post("kv/txn", {
            "compare": [{"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": k, "value": _encode(value), "lease": lease}}, read],
            "failure": [read]})
        kvs = reply.get("responses", [{}])[-1].get("response_range", {}).get("kvs", [])
        return CampaignResult(bool(reply.get("succeeded", False)), _record(kvs[0]) if kvs else None)

    # --- LeaderKeyWatch ------------------------------------------------------
    def watch(self, key: str, on_change: Callable[[], None], stop: threading.Event) -> None:
        index, resume = self._preferred, 0
        while not stop.is_set():
            try:
                resume = self._watch_stream(index, _encode(key), resume, on_change, stop)
            except (OSError, ValueError, KeyError, TypeError) as exc:  # requests' errors are OSErrors
                log.debug("watch of %s on %s: %s", key, self.members[index], exc)
                index = (index + 1) % len(self.members)
            stop.wait(WATCH_RETRY_S)  # between streams, so a member that ends each at once costs no spin

    def _watch_stream(self, index: int, key: str, resume: int, on_change: Callable[[], None],
                      stop: threading.Event) -> int:
        """One watch stream on members[index] from revision resume (0: now); the revision to resume at."""
        client = self._client(index, self._timeout_s)
        create: dict[str, Any] = {"key": key, **({"start_revision": resume} if resume else {})}
        with client.session.post(client.get_url("watch"), json={"create_request": create}, stream=True,
                                 timeout=(self._timeout_s, WATCH_IDLE_S)) as reply:
            if reply.status_code != 200:
                raise ValueError(f"watch refused: HTTP {reply.status_code}")
            try:
                # chunk_size None: each message as it arrives (requests takes it; its stubs say int)
                for line in reply.iter_lines(chunk_size=None):  # type: ignore[call-overload]
                    if stop.is_set():
                        return resume
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result", {})
                    revision = int(result.get("header", {}).get("revision", 0))
                    if result.get("canceled"):  # e.g. resume compacted away: start afresh
                        on_change()
                        return 0
                    if result.get("created"):
                        if not resume:  # a fresh watch: a change before it would be unseen
                            on_change()
                            resume = revision + 1
                        continue  # a resumed one: etcd replays from resume next (not yet seen)
                    if result.get("events"):
                        on_change()
                    resume = max(resume, revision + 1)
            except OSError:  # idle for WATCH_IDLE_S (a read timeout) or the stream broke: reopen from resume
                return resume
        return resume

    # --- FencedKeyStore ------------------------------------------------------
    def write_fenced(self, fence_key: str, epoch: int, puts: Mapping[str, bytes], deletes: Sequence[str]) -> bool:
        ops: list[dict[str, Any]] = [{"request_put": {"key": _encode(k), "value": _encode(v)}} for k, v in puts.items()]
        ops += [{"request_delete_range": {"key": _encode(k)}} for k in deletes]
        reply, failed_before = self._send("kv/txn", {
            "compare": [{"key": _encode(fence_key), "result": "EQUAL", "target": "CREATE", "create_revision": epoch}],
            "success": ops, "failure": []})
        applied = bool(reply.get("succeeded", False))
        if not applied and failed_before:
            raise Unavailable(f"etcd at {self.endpoint}: a fenced write failed on one member and was refused "
                              f"by the next: {', '.join(failed_before)}; whether the first applied it is unknown")
        return applied

    def read_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        end = _encode(_next_prefix(prefix))
        start, revision, found = _encode(prefix), 0, []
        while True:
            payload: dict[str, Any] = {"key": start, "range_end": end, "limit": READ_PAGE}
            if revision:
                payload["revision"] = revision
            reply = self._post("kv/range", payload, self._read_timeout_s)
            revision = revision or int(reply["header"]["revision"])
            kvs = reply.get("kvs", [])
            found += [(_decode(kv["key"]).decode(), _decode(kv.get("value", ""))) for kv in kvs]
            if not reply.get("more", False) or not kvs:
                return found
            start = _encode(_decode(kvs[-1]["key"]) + b"\0")

    # --- plumbing ------------------------------------------------------------
    def _post(self, path: str, payload: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        return self._send(path, payload, timeout_s)[0]

    def _send(self, path: str, payload: dict[str, Any], timeout_s: float | None = None
              ) -> tuple[dict[str, Any], list[str]]:
        """The first member's answer (module docstring), and the members that failed before it."""
        count = len(self.members)
        first = self._preferred
        failures: list[str] = []
        for k in range(count):
            index = (first + k) % count
            member = self.members[index]
            client = self._client(index, timeout_s or self._timeout_s)
            try:
                reply = client.post(client.get_url(path), json=payload)
            except MEMBER_FAILURES as exc:
                failures.append(f"{member}: {_detail(exc)}")
                continue
            except Etcd3Exception as exc:  # the cluster's answer: another member would say the same
                raise Unavailable(f"etcd at {member}: {path}: {_detail(exc)}") from None
            except ValueError as exc:  # a reply that is not JSON: this member is not well
                failures.append(f"{member}: unreadable reply ({exc})")
                continue
            self._preferred = index
            return (reply if isinstance(reply, dict) else {}), [f.split(": ", 1)[0] for f in failures]
        raise Unavailable(f"etcd at {self.endpoint}: {path}: no member answered: {'; '.join(failures)}")

    def _client(self, index: int, timeout_s: float) -> Etcd3Client:
        clients: dict[tuple[int, float], Etcd3Client] | None = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        if (index, timeout_s) not in clients:
            member = self.members[index]
            client = Etcd3Client(member.host, member.port, protocol=member.scheme, timeout=timeout_s,
                                 api_path=API_PATH)
            if member.scheme == "https":
                _present(client, self._tls)
            clients[(index, timeout_s)] = client
        return clients[(index, timeout_s)]


def _present(client: Etcd3Client, tls: EtcdTls) -> None:
    """client's HTTP session (requests) presents tls. A CA given is the only one trusted: requests would
    otherwise let REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE from the environment replace a session's CA (its
    documented precedence), so the session does not read the environment (no proxies from it either:
    etcd is dialled directly)."""
    if tls.ca:
        client.session.verify = tls.ca
        client.session.trust_env = False
    if tls.cert:
        client.session.cert = (tls.cert, tls.key)


def _detail(exc: Etcd3Exception) -> str:
    detail = exc.detail_text or type(exc).__name__
    return " ".join(str(detail).split())[:300]


def _encode(data: str | bytes) -> str:
    """base64 of a key or value; text as UTF-8 (etcd3gw's own encoder takes text as latin-1)."""
    return _b64(data.encode() if isinstance(data, str) else data)


def _record(kv: dict[str, Any]) -> KeyRecord:
    return KeyRecord(_decode(kv.get("value", "")), int(kv.get("create_revision", 0)), int(kv.get("lease", 0)))


def _next_prefix(prefix: str) -> bytes:
    """The first key after every key that starts with prefix (etcd's range_end for a prefix)."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return b"\0"  # every key
    raw[-1] += 1
    return bytes(raw)
