"""A streamed completion from an OpenAI-compatible server (vLLM's), with
token ids in and out, and its time to first token: the client side of the
real-engine cluster. Standard library only (http.client).

TTFT is the wall time from sending the request to the first streamed chunk
that carries a token: what a user of a streaming API waits for. The final
chunk's usage (asked for with stream_options.include_usage) says how many
prompt tokens the engine did not compute: vLLM's `cached_tokens`, its own
prefix cache and what its KV connector loaded (the server needs
--enable-prompt-tokens-details; without it the figure is None).
"""
from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Completion:
    """Seconds from the request's start; token_ids as generated; started_at
    and first_token_at on time.perf_counter's clock."""

    ttft_s: float
    total_s: float
    token_ids: tuple[int, ...]
    cached_tokens: int | None = None
    started_at: float = 0.0
    first_token_at: float = 0.0


def stream_completion(base_url: str, model: str, prompt: Sequence[int], max_tokens: int,
                      timeout_s: float = 600.0, on_first_token: Callable[[], None] | None = None,
                      kv_transfer_params: Mapping[str, Any] | None = None) -> Completion:
    """Greedy, EOS ignored (exactly max_tokens tokens); RuntimeError on an
    HTTP error or a stream without tokens. on_first_token: called once, on
    the reading thread, when the first token arrives. kv_transfer_params:
    handed to the engine's KV connector (vLLM's request field)."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    body = json.dumps({"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0.0,
                       "stream": True, "ignore_eos": True, "return_token_ids": True,
                       "stream_options": {"include_usage": True},
                       **({"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params else {})})
    started = time.perf_counter()
    try:
        connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        if reply.status != 200:
            raise RuntimeError(f"{base_url}: HTTP {reply.status}: {reply.read()[:500]!r}")
        first, tokens, cached = None, [], None
        for raw in reply:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                cached = int(details["cached_tokens"])
            for choice in chunk.get("choices", []):
                got = choice.get("token_ids") or []
                if got and first is None:
                    first = time.perf_counter() - started
                    if on_first_token is not None:
                        on_first_token()
                tokens.extend(got)
    finally:
        connection.close()
    if first is None:
        raise RuntimeError(f"{base_url}: the stream carried no token")
    return Completion(first, time.perf_counter() - started, tuple(tokens), cached, started, started + first)
