"""SpeckvConnector: vLLM's KVConnectorBase_V1 (vLLM 0.32) onto the node's
kvstore. Load it with

    kv_transfer_config = {"kv_connector": "SpeckvConnector",
                          "kv_connector_module_path": "speckv.services.engine.vllm_connector.connector",
                          "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                          "kv_connector_extra_config": {"kvstore": "host:port"}}

vLLM builds one instance per role: the scheduler's (SchedulerSide) and each
worker's (WorkerSide); the scheduler hands the worker a SpeckvMetadata per
step. It fails open: a kvstore that is down, slow, or of another geometry
costs a recompute (counted in Counters, one log line), never a failed
request. Block ids: identity.py. On the kvstore's host KV moves through its
mapped pools (shared_client.py), elsewhere over gRPC (kvstore_client.py).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable

import grpc

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorTransferResults)

from speckv.services.common.errors import SpeckvError
from speckv.services.common.rpc.tls import TlsFiles, TlsMaterial
from speckv.services.engine.vllm_connector.identity import KVLayout
from speckv.services.engine.vllm_connector.counters import ALL_COUNTERS, Counters
from speckv.services.engine.vllm_connector.kvstore_client import KVStoreClient
from speckv.services.engine.vllm_connector.pages import PageKind, pages_refused
from speckv.services.engine.vllm_connector.plan import StepPlan
from speckv.services.engine.vllm_connector.port import PullTarget
from speckv.services.engine.vllm_connector.scheduler_side import SchedulerSide
from speckv.services.engine.vllm_connector.settings import ConnectorSettings, layout_of
from speckv.services.engine.vllm_connector.shared_client import SharedKVStore
from speckv.services.engine.vllm_connector.worker_side import WorkerSide
from speckv.v1 import kvstore_pb2

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("speckv.vllm_connector")


class SpeckvMetadata(KVConnectorMetadata):
    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class SpeckvConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        settings = ConnectorSettings.parse(self._kv_transfer_config.kv_connector_extra_config or {})
        self.counters = Counters()
        ALL_COUNTERS.append(self.counters)
        tls, tls_error = _tls(settings)
        self._client = KVStoreClient(settings.kvstore, self.counters, settings.lookup_timeout_s,
                                     settings.transfer_timeout_s, settings.max_message_mb,
                                     pin_at_lookup=settings.shared_memory, tls=tls)
        # The peers' kvstores a request may pull from; dialled lazily by gRPC, so a peer down costs nothing here.
        self._peers = {node: KVStoreClient(address, self.counters, settings.lookup_timeout_s,
                                           settings.transfer_timeout_s, settings.max_message_mb, tls=tls, peer=True)
                       for node, address in settings.peers.items()}
        layout, why_not = layout_of(vllm_config, settings)
        why_not = tls_error or why_not
        policy = getattr(self._kv_transfer_config, "kv_load_failure_policy", None)
        if layout is not None and policy != "recompute":
            # vLLM's default, "fail", ends a request whose load failed: speckv's loads must fail open.
            why_not = (f"kv_load_failure_policy is {policy!r}: set \"recompute\" so that a failed load costs a "
                       "recompute, not the request")
        if layout is not None and role == KVConnectorRole.SCHEDULER and not why_not:
            why_not = _geometry_mismatch(self._client, layout)
        if why_not:
            log.warning("SpeckvConnector off (%s): the engine runs without the kvstore", why_not)
            layout = None
        self.layout = layout
        if layout is not None and role == KVConnectorRole.SCHEDULER:
            # What the scheduler needs to index this engine's own KV events under these ids (--kv-events).
            log.info("SpeckvConnector on kvstore %s; layout digest %s (the scheduler's --kv-events digest=)",
                     settings.kvstore, layout.digest().hex())
        self._scheduler = SchedulerSide(layout, self._client, self.counters, self._peers, settings.load_async) \
            if layout is not None and role == KVConnectorRole.SCHEDULER else None
        self._shared = _open_shared(self._client, layout, settings, self.counters) \
            if layout is not None and role == KVConnectorRole.WORKER and settings.shared_memory else None
        self._worker = WorkerSide(layout, self._client, self.counters, self._shared, self._peers,
                                  _pull_target_or_later(self._client, settings), settings.load_by_layer) \
            if layout is not None and role == KVConnectorRole.WORKER else None

    # Scheduler side

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._scheduler is None:
            return 0, False
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        if self._scheduler is not None:
            self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        plan = self._scheduler.build_step(scheduler_output) if self._scheduler is not None else StepPlan()
        return SpeckvMetadata(plan)

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        if self._scheduler is not None:
            self._scheduler.loads_ended(set(connector_output.finished_recving or ()),
                                        set(connector_output.failed_recving or ()))

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        # Saves copy the pages at the step's end, so only a background load still writing them holds them.
        delay = self._scheduler.request_finished(request) if self._scheduler is not None else False
        return delay, None

    # Worker side

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        if self._worker is None or self.layout is None:
            return
        why_not = pages_refused(PageKind(self.layout.page_layout), _attention_backends(self._vllm_config, kv_caches),
                                {name: cache.device.type for name, cache in kv_caches.items()})
        try:
            if not why_not:
                self._worker.register_kv_caches(kv_caches)
        except ValueError as error:
            why_not = str(error)
        if why_not:
            # No pages registered: every load the scheduler side plans fails and is recomputed, nothing is saved.
            log.warning("SpeckvConnector off on this worker (%s): its loads are recomputed", why_not)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        if self._worker is not None and isinstance(metadata, SpeckvMetadata):
            self._worker.load(metadata.plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Called in each attention layer before it reads its pages (vLLM's maybe_transfer_kv_layer).
        if self._worker is not None:
            self._worker.wait_for_layer(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: Any, **kwargs: Any) -> None:
        return  # wait_for_save copies every layer's pages at once, after the forward

    def wait_for_save(self) -> None:
        if self._worker is not None:
            self._worker.finish_loads()  # after the forward: the step's layer-by-layer loads end with it
        if self._worker is not None and self.has_connector_metadata():
            metadata = self._get_connector_metadata()
            if isinstance(metadata, SpeckvMetadata):
                try:
                    self._worker.save(metadata.plan)
                except Exception:  # noqa: BLE001 - a save that cannot be made leaves its blocks engine-only
                    self.counters.add(save_failures=1)
                    log.exception("speckv: a save failed; its blocks stay engine-only")

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Layer-by-layer loads wait in each attention layer (wait_for_layer_load),
        which a full CUDA graph's replay skips: they need vLLM's piecewise graphs."""
        return extra_config.get("load_by_layer") is True

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Background loads that ended (load_async); a failed one is also finished, as vLLM asks."""
        if self._worker is None:
            return KVConnectorTransferResults()
        finished, failed = self._worker.take_finished_loads()
        return KVConnectorTransferResults(finished_recving=finished, failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors() if self._worker is not None else set()

    def flush(self) -> None:
        """Wait until this worker's saves have reached the kvstore (or failed)."""
        if self._worker is not None:
            self._worker.flush()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._shared is not None:
            self._shared.close()
        for peer in self._peers.values():
            peer.close()
        self._client.close()


def _attention_backends(vllm_config: "VllmConfig", names: Iterable[str]) -> dict[str, str | None]:
    """Each layer's attention backend name as vLLM chose it (None where it cannot be read)."""
    layers = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {}
    backends: dict[str, str | None] = {}
    for name in names:
        backend = getattr(layers.get(name), "attn_backend", None)
        try:
            backends[name] = backend.get_name() if backend is not None else None
        except Exception:  # noqa: BLE001 - an unreadable backend is an unknown one: refused, not guessed
            backends[name] = None
    return backends


def _tls(settings: ConnectorSettings) -> tuple[TlsMaterial | None, str]:
    """The engine's TLS material, or why it cannot be used (then the
    connector stays off: the engine serves, recomputing)."""
    try:
        files = TlsFiles.from_settings(settings.tls_cert, settings.tls_key, settings.tls_ca)
        return (files.load() if files is not None else None), ""
    except (SpeckvError, OSError, ValueError) as error:
        return None, f"its TLS files cannot be used: {error}"


def _pull_target(client: KVStoreClient, settings: ConnectorSettings) -> PullTarget | None:
    """This node as its pulls name it; None without peers, or when the
    kvstore cannot say its node id now (then pulls fail open)."""
    if not settings.peers:
        return None
    node_id = settings.node_id or client.node_id()
    if not node_id:
        log.warning("SpeckvConnector: kvstore %s did not say its node id; pulls from peers are off "
                    "(set node_id in kv_connector_extra_config)", settings.kvstore)
        return None
    return PullTarget(node_id, settings.kvstore)


def _pull_target_or_later(client: KVStoreClient,
                          settings: ConnectorSettings) -> PullTarget | Callable[[], PullTarget | None] | None:
    """This node as pulls name it, or, when its kvstore cannot say yet (it
    starts after the engine), how to ask again at the first pull."""
    target = _pull_target(client, settings)
    if target is not None or not settings.peers:
        return target
    return lambda: _pull_target(client, settings)


def _open_shared(client: KVStoreClient, layout: KVLayout, settings: ConnectorSettings,
                 counters: Counters) -> SharedKVStore | None:
    """The kvstore's pools mapped here when it runs on this host as this user
    and holds this engine's geometry; None otherwise (KV then moves over gRPC)."""
    shared = SharedKVStore.open(client.stub, client.address, counters, settings.transfer_timeout_s,
                                settings.transfer_timeout_s)
    if shared is None:
        return None
    g = shared.pools.geometry
    theirs = (g.num_layers, g.num_kv_heads, g.head_dim, g.dtype, g.block_size)
    if theirs != (layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.dtype, layout.block_size):
        log.warning("speckv kvstore %s: shared pools of another geometry %s; KV moves over gRPC", client.address, theirs)
        shared.close()
        return None
    return shared


def _geometry_mismatch(client: KVStoreClient, layout: KVLayout) -> str:
    """Why the kvstore cannot hold this engine's blocks ("" if it can, or if
    it cannot be asked now: then each later call fails open on its own)."""
    try:
        stats = client.stub.GetStats(kvstore_pb2.StatsRequest(), timeout=2.0)
    except grpc.RpcError:
        return ""
    g = stats.geometry
    theirs = (g.num_layers, g.num_kv_heads, g.head_dim, g.dtype, g.block_size)
    ours = (layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.dtype, layout.block_size)
    if theirs != ours:
        return f"kvstore {client.address} holds (layers, kv heads, head dim, dtype, block size) {theirs}, the engine {ours}"
    return ""
