"""`--kv-events`: the scheduler's list of vLLM engines to index from their
ZMQ KV events, parsed into one VllmNodeSpec per engine (vllm_subscriber.py
runs their feeds). Pure: no zmq, no I/O."""
from __future__ import annotations

from dataclasses import dataclass

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.vllm_block_ids import parse_digest
from speckv.services.scheduler.adapters.vllm_health import check_health_url

DEFAULT_PAGES = 65536  # a placeholder capacity when pages= is not given (only policies read it)
OPTIONS = ("replay", "address", "pages", "topic", "digest", "kvstore", "health")
FLAGS = {"1": True, "yes": True, "true": True, "0": False, "no": False, "false": False}


@dataclass(frozen=True, slots=True)
class VllmNodeSpec:
    """One vLLM engine (one data-parallel rank: each rank publishes on its own port)."""

    node_id: str
    endpoint: str  # vLLM's PUB socket, e.g. tcp://10.0.0.5:5557
    replay_endpoint: str = ""  # vLLM's replay ROUTER socket; "" = no catch-up, gaps reset the node
    address: str = ""  # what Route answers for this node (the engine's serving host:port)
    pages: int = DEFAULT_PAGES  # the engine's KV blocks (vLLM's num_gpu_blocks)
    topic: str = ""  # topic prefix subscribed to (vLLM's default topic is "")
    # The engine's layout digest (the connector logs it): its blocks are indexed under the connector's ids,
    # which routers send (services/common/vllm_block_ids.py); None: under vLLM's own event ids.
    digest: bytes | None = None
    # A kvstore registers this node and streams its tiers; the engine's events are the node's second source.
    kvstore: bool = False
    health: str = ""  # the engine's OpenAI server's health URL, probed (vllm_health.py); "": not probed

    @property
    def route_address(self) -> str:
        """address, else the PUB endpoint's host:port."""
        return self.address or self.endpoint.split("://", 1)[1]


def parse_kv_events(text: str) -> list[VllmNodeSpec]:
    """Parses --kv-events: entries separated by ';', each
    `NODE=PUB_ENDPOINT[,replay=ENDPOINT][,address=HOST:PORT][,pages=N][,topic=T][,digest=HEX][,kvstore=1]
    [,health=http://HOST:PORT/health]`.
    InvalidArgument names the entry and what is wrong."""
    specs: list[VllmNodeSpec] = []
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        head, *options = [part.strip() for part in entry.split(",")]
        node_id, sep, endpoint = head.partition("=")
        if not sep or not node_id.strip():
            raise InvalidArgument(f"kv_events entry {entry!r}: expected NODE=tcp://HOST:PORT[,replay=...]")
        values: dict[str, str] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key.strip() not in OPTIONS or key.strip() in values:
                raise InvalidArgument(f"kv_events entry {entry!r}: option {option!r} is not one of "
                                      "replay=, address=, pages=, topic=, digest=, kvstore=, health= (each at most once)")
            values[key.strip()] = value.strip()
        spec = VllmNodeSpec(node_id.strip(), endpoint.strip(), values.get("replay", ""), values.get("address", ""),
                            _pages(entry, values.get("pages")), values.get("topic", ""),
                            _digest(entry, values.get("digest")), _flag(entry, "kvstore", values.get("kvstore")),
                            values.get("health", ""))
        _check_spec(entry, spec, values)
        if any(s.node_id == spec.node_id for s in specs):
            raise InvalidArgument(f"kv_events: node {spec.node_id!r} is named twice")
        specs.append(spec)
    return specs


def _digest(entry: str, text: str | None) -> bytes | None:
    if text is None:
        return None
    try:
        return parse_digest(text)
    except ValueError as exc:
        raise InvalidArgument(f"kv_events entry {entry!r}: digest={text[:80]!r}: {exc}") from None


def _flag(entry: str, name: str, text: str | None) -> bool:
    if text is None:
        return False
    flag = FLAGS.get(text.lower())
    if flag is None:
        raise InvalidArgument(f"kv_events entry {entry!r}: {name}={text!r}: expected 1 or 0 (yes/no, true/false)")
    return flag


def _pages(entry: str, text: str | None) -> int:
    if text is None:
        return DEFAULT_PAGES
    try:
        pages = int(text)
    except ValueError:
        pages = 0
    if pages <= 0:
        raise InvalidArgument(f"kv_events entry {entry!r}: pages={text!r} must be a whole number > 0")
    return pages


def _check_spec(entry: str, spec: VllmNodeSpec, values: dict[str, str]) -> None:
    for name, endpoint in (("endpoint", spec.endpoint), ("replay", spec.replay_endpoint)):
        if endpoint and not endpoint.startswith(("tcp://", "ipc://")):
            raise InvalidArgument(f"kv_events entry {entry!r}: {name} {endpoint!r} must be tcp://HOST:PORT "
                                  "or ipc://PATH (the scheduler connects; vLLM binds)")
    if spec.endpoint.startswith("tcp://") and ":" not in spec.endpoint[len("tcp://"):]:
        raise InvalidArgument(f"kv_events entry {entry!r}: endpoint {spec.endpoint!r} lacks a port")
    wrong = check_health_url(spec.health) if "health" in values else ""
    if wrong:
        raise InvalidArgument(f"kv_events entry {entry!r}: health={spec.health!r} {wrong}")
    if spec.kvstore:
        given = [name for name in ("address", "pages") if name in values]
        if given:
            raise InvalidArgument(f"kv_events entry {entry!r}: {'= and '.join(given)}= cannot go with kvstore=1 "
                                  "(the node's kvstore registers it, with its address and sizes)")
        return
    if ":" not in spec.route_address:
        raise InvalidArgument(f"kv_events entry {entry!r}: give address=HOST:PORT (what Route answers)")
