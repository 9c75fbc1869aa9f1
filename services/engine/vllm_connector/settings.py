"""The connector's settings (vLLM's kv_connector_extra_config) and the KV
layout it reads from vLLM's config.

    kv_transfer_config = {
        "kv_connector": "SpeckvConnector",
        "kv_connector_module_path": "speckv.services.engine.vllm_connector.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",   # a failed load is recomputed, never a failed request
        "kv_connector_extra_config": {"kvstore": "127.0.0.1:50051", ...},
    }

`peers` ({node id: "host:port"}) names the other nodes' kvstores that a
request may ask to pull from (kv_transfer_params {"speckv": {"pull_from":
NODE}}); a request cannot make the engine dial anything else. A pull asks
that peer's kvstore to copy the blocks to `kvstore`, so `kvstore` should be
the address the node's kvstore registered with the scheduler (a protected
peer sends nowhere else).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from speckv.services.engine.vllm_connector.identity import KVLayout
from speckv.services.engine.vllm_connector.pages import kind_for_device


@dataclass(frozen=True, slots=True)
class ConnectorSettings:
    kvstore: str  # host:port of the node's kvstore
    model_id: str = ""  # the model's id in block ids; empty: vLLM's model (path or hub name)
    lookup_timeout_s: float = 0.5  # a slower kvstore costs a recompute, not a stall
    transfer_timeout_s: float = 10.0
    max_message_mb: int = 64
    shared_memory: bool = True  # map the kvstore's pools when it runs on this host as this user (off: gRPC only)
    # Mutual TLS to a kvstore that serves it: the node's engine certificate (spiffe://speckv/engine/<node>),
    # its key and the cluster's CA (PEM paths; all three or none).
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    peers: Mapping[str, str] = field(default_factory=dict)  # node id -> host:port of its kvstore (pulls)
    node_id: str = ""  # this node's id, as pulls name it; empty: asked of the kvstore (GetStats) at start
    load_async: bool = False  # load beside the engine's steps (vLLM's async loads) instead of before the forward
    # A step's loads copied layer by layer beside its forward (layer_loads.py); off: whole, before it. Why it
    # is off by default: docs/vllm_connector.md, "Layer-by-layer loads".
    load_by_layer: bool = False

    @classmethod
    def parse(cls, extra: Mapping[str, Any]) -> "ConnectorSettings":
        if not extra.get("kvstore"):
            raise ValueError("SpeckvConnector: kv_connector_extra_config needs 'kvstore' (host:port)")
        known = {k: extra[k] for k in ("kvstore", "model_id", "lookup_timeout_s", "transfer_timeout_s",
                                       "max_message_mb", "shared_memory", "tls_cert", "tls_key", "tls_ca", "peers", "node_id", "load_async",
                                       "load_by_layer") if k in extra}
        settings = cls(**known)
        for flag in ("shared_memory", "load_async", "load_by_layer"):
            if not isinstance(getattr(settings, flag), bool):
                raise ValueError(f"SpeckvConnector: {flag}={getattr(settings, flag)!r}: true or false")
        if len({bool(settings.tls_cert), bool(settings.tls_key), bool(settings.tls_ca)}) != 1:
            raise ValueError("SpeckvConnector: tls_cert, tls_key and tls_ca go together (all three or none)")
        peers = settings.peers
        if not isinstance(peers, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                                     for k, v in peers.items()):
            raise ValueError(f"SpeckvConnector: peers={peers!r}: a map of node id to its kvstore's host:port")
        if settings.lookup_timeout_s <= 0 or settings.transfer_timeout_s <= 0:
            raise ValueError("SpeckvConnector: lookup_timeout_s and transfer_timeout_s must be > 0")
        return settings


def layout_of(vllm_config: Any, settings: ConnectorSettings) -> tuple[KVLayout | None, str]:
    """The engine's KV layout, or None and why the connector cannot serve it
    (then it stays off: the engine runs as without it)."""
    model, cache, parallel = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        return None, "tensor or pipeline parallel engines are a later step (one rank only)"
    device = str(getattr(vllm_config.device_config, "device_type", "cpu"))
    kind = kind_for_device(device)
    if kind is None:
        return None, f"device {device!r}: only vLLM's CPU and CUDA page layouts are converted"
    dtype = cache.cache_dtype if cache.cache_dtype != "auto" else str(model.dtype).removeprefix("torch.")
    if "nvfp4" in dtype:
        # NVFP4 pages keep K and V in separate head groups with block scales beside them: another layout.
        return None, f"KV cache dtype {dtype!r}: its pages are not converted"
    layout = KVLayout(
        model=settings.model_id or str(model.model), dtype=dtype, block_size=int(cache.block_size),
        num_layers=model.get_num_layers(parallel), num_kv_heads=model.get_num_kv_heads(parallel),
        head_dim=model.get_head_size(), tp_rank=0, page_layout=kind.value,
        hash_algo=str(cache.prefix_caching_hash_algo))
    return layout, ""
