"""A streamed completion from an OpenAI-compatible server (vLLM's), with
token ids in and out, and its time to first token: the client side of the
real-engine cluster. Standard library only (http.client).

TTFT is the wall time from sending the request to the first streamed chunk
that carries a token: what a user of a streaming API waits for.
"""
from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Completion:
    """Seconds from the request's start; token_ids as generated."""

    ttft_s: float
    total_s: float
    token_ids: tuple[int, ...]


def stream_completion(base_url: str, model: str, prompt: Sequence[int], max_tokens: int,
                      timeout_s: float = 600.0) -> Completion:
    """Greedy, EOS ignored (exactly max_tokens tokens); RuntimeError on an
    HTTP error or a stream without tokens."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    body = json.dumps({"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0.0,
                       "stream": True, "ignore_eos": True, "return_token_ids": True})
    started = time.perf_counter()
    try:
        connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        if reply.status != 200:
            raise RuntimeError(f"{base_url}: HTTP {reply.status}: {reply.read()[:500]!r}")
        first, tokens = None, []
        for raw in reply:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            for choice in json.loads(data).get("choices", []):
                got = choice.get("token_ids") or []
                if got and first is None:
                    first = time.perf_counter() - started
                tokens.extend(got)
    finally:
        connection.close()
    if first is None:
        raise RuntimeError(f"{base_url}: the stream carried no token")
    return Completion(first, time.perf_counter() - started, tuple(tokens))
