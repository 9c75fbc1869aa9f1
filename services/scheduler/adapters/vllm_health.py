"""The health probe of one vLLM engine (`--kv-events ...,health=URL`): a
thread that GETs the engine's OpenAI server's `/health` every interval and
feeds the outcome to the engine's EngineLiveness (engine_liveness.py holds
the rules). The subscription thread (vllm_subscriber.py) takes the
transitions from it and acts on them in its own thread, so the index is only
ever changed from the thread that applies the engine's events.

Why HTTP /health and not vLLM's replay socket: the API server is what
routers send requests to; vLLM 0.32 answers 200 there while the server and
its engine core run and 503 once the engine core is dead (its `errored`
flag: a hung engine core still answers 200), and once the process is gone
the port refuses. The replay ROUTER lives in the engine
core's publisher thread, beside the PUB socket whose disconnection the
subscriber already sees, and it keeps answering when the API server is gone.
"""
from __future__ import annotations

import http.client
import queue
import threading
import urllib.error
import urllib.request
from typing import Callable
from urllib.parse import urlsplit

from speckv.services.common.clock import Clock, SystemClock
from speckv.services.scheduler.engine_liveness import EngineLiveness, LivenessRule, Outcome, Transition

Probe = Callable[[], tuple[bool, str]]  # (answered healthy, what went wrong if not)


def check_health_url(url: str) -> str:
    """The reason url is not an http(s)://HOST:PORT/PATH a probe can GET; "" when it is."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be http://HOST:PORT/health (the engine's OpenAI server)"
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        return "has a port that is not a number"
    return ""


def http_probe(url: str, timeout_s: float) -> Probe:
    """GET url: answered when the reply is 2xx within timeout_s (connect and
    read each). Never through a proxy (HTTP_PROXY and the like are ignored):
    it is the engine itself that must answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def probe() -> tuple[bool, str]:
        try:
            with opener.open(url, timeout=timeout_s) as reply:
                reply.read()
                return 200 <= reply.status < 300, f"HTTP {reply.status}"
        except urllib.error.HTTPError as error:  # 503: vLLM has declared its engine dead
            return False, f"HTTP {error.code}"
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            return False, str(getattr(error, "reason", None) or error)

    return probe


class HealthProber:
    """Probes one engine on its own thread; `take()` hands over the transitions."""

    def __init__(self, name: str, probe: Probe, rule: LivenessRule, clock: Clock | None = None) -> None:
        self._probe = probe
        self._liveness = EngineLiveness(rule, clock or SystemClock())
        self._transitions: queue.SimpleQueue[tuple[Outcome, str]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"vllm-health-{name}", daemon=True)

    def start(self) -> "HealthProber":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float) -> bool:
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def take(self) -> list[tuple[Outcome, str]]:
        """The transitions since the last call, in order, each with the last probe's detail."""
        taken = []
        while True:
            try:
                taken.append(self._transitions.get_nowait())
            except queue.Empty:
                return taken

    def _run(self) -> None:
        while not self._stop.wait(self._liveness.wait_s()):
            answered, detail = self._probe()
            outcome = self._liveness.record(answered)
            if outcome.transition is not Transition.NONE:
                self._transitions.put((outcome, detail))
