"""EtcdKeys: keys.py's LeaderKeyStore and FencedKeyStore on a real etcd v3
(3.4+), through its gRPC gateway's JSON API with etcd3gw.

- Every failure to get an answer from etcd (connection refused or reset, a
  timeout, an error status such as "no leader") raises Unavailable naming
  the endpoint; the election and the state store treat all of those as
  "etcd unreachable now".
- Calls time out after `timeout_s` (keep it under a lease round, TTL/3, so a
  round never blocks past the lead's valid-until for long); `read_prefix`,
  which may carry the whole order log, after `read_timeout_s`.
- read_prefix reads in pages of READ_PAGE keys, every page at the revision
  of the first, so the result is one consistent snapshot however large.
- One HTTP session per thread (the elector's and the scheduler's threads
  call concurrently; requests' sessions are not documented thread-safe).
- The gateway's JSON: int64 fields are strings, fields at their default
  (0, false, empty) are omitted, keys and values are base64.
"""
from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import Etcd3Exception
from etcd3gw.utils import _decode, _encode as _b64

from speckv.services.common.errors import InvalidArgument, Unavailable
from speckv.services.scheduler.leadership.keys import CampaignResult, KeyRecord, LeaseId

API_PATH = "/v3/"  # etcd >= 3.4 (no discovery round trip)
READ_PAGE = 1000
DEFAULT_TIMEOUT_S = 0.5
DEFAULT_READ_TIMEOUT_S = 10.0


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """host and port of "http://host:port" or "host:port"."""
    text = endpoint if "://" in endpoint else f"http://{endpoint}"
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise InvalidArgument(f"etcd endpoint {endpoint!r}: expected http://HOST:PORT or HOST:PORT")
    return parts.hostname, port


class EtcdKeys:
    def __init__(self, endpoint: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> None:
        self.endpoint = endpoint
        self._host, self._port = parse_endpoint(endpoint)
        self._timeout_s, self._read_timeout_s = timeout_s, read_timeout_s
        self._local = threading.local()

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

    # --- FencedKeyStore ------------------------------------------------------
    def write_fenced(self, fence_key: str, epoch: int, puts: Mapping[str, bytes], deletes: Sequence[str]) -> bool:
        ops: list[dict[str, Any]] = [{"request_put": {"key": _encode(k), "value": _encode(v)}} for k, v in puts.items()]
        ops += [{"request_delete_range": {"key": _encode(k)}} for k in deletes]
        reply = self._post("kv/txn", {
            "compare": [{"key": _encode(fence_key), "result": "EQUAL", "target": "CREATE", "create_revision": epoch}],
            "success": ops, "failure": []})
        return bool(reply.get("succeeded", False))

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
        client = self._client(timeout_s or self._timeout_s)
        try:
            reply = client.post(client.get_url(path), json=payload)
        except Etcd3Exception as exc:
            detail = exc.detail_text or type(exc).__name__
            raise Unavailable(f"etcd at {self.endpoint}: {path}: {' '.join(str(detail).split())[:300]}") from None
        except ValueError as exc:  # a reply that is not JSON
            raise Unavailable(f"etcd at {self.endpoint}: {path}: unreadable reply ({exc})") from None
        return reply if isinstance(reply, dict) else {}

    def _client(self, timeout_s: float) -> Etcd3Client:
        clients: dict[float, Etcd3Client] | None = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        if timeout_s not in clients:
            clients[timeout_s] = Etcd3Client(self._host, self._port, timeout=timeout_s, api_path=API_PATH)
        return clients[timeout_s]


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
