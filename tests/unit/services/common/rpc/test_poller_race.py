"""grpc's connectivity poller, racing a channel closed right after subscribe,
raises in its own thread; a process with the quieting hook logs no traceback
for it, and still prints every other thread's exception. Each case runs in a
fresh interpreter: the hook is process-wide, and pytest swaps the thread hook
during a test."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from speckv.services.common.rpc.poller_race import is_closed_channel_poller, quieting

RACE = textwrap.dedent("""
    import threading, time
    import grpc
    from speckv.services.common.rpc.poller_race import quiet_closed_channel_pollers
    if {quiet}:
        quiet_closed_channel_pollers()
        quiet_closed_channel_pollers()  # a second install is a no-op
    for _ in range(10):
        channel = grpc.insecure_channel("127.0.0.1:9")
        channel.subscribe(lambda state: None, try_to_connect=False)
        channel.close()
    def unrelated():
        raise ValueError("an unrelated bug")
    thread = threading.Thread(target=unrelated)
    thread.start()
    thread.join()
    time.sleep(0.6)  # a poller's step is 0.2 s
    print("done")
""")


def _run(quiet: bool) -> str:
    done = subprocess.run([sys.executable, "-c", RACE.format(quiet=quiet)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-2000:]
    return done.stderr


def test_without_the_hook_the_race_prints_grpcs_traceback() -> None:
    # The reason the hook exists: if a grpc release fixes the race, this fails and the hook can go.
    assert "Cannot monitor channel state" in _run(quiet=False)


def test_with_the_hook_only_the_unrelated_exception_is_printed() -> None:
    stderr = _run(quiet=True)
    assert "Cannot monitor channel state" not in stderr
    assert stderr.count("Traceback") == 1
    assert "an unrelated bug" in stderr


def _hook_args(message: str, function: str, filename: str) -> threading.ExceptHookArgs:
    """The excepthook's arguments for a ValueError raised in `function` of `filename`."""
    namespace: dict = {}
    exec(compile(f"def {function}():\n    raise ValueError({message!r})\n", filename, "exec"), namespace)
    try:
        namespace[function]()
    except ValueError as exc:
        return threading.ExceptHookArgs((ValueError, exc, exc.__traceback__, None))
    raise AssertionError("did not raise")


GRPC_CHANNEL = "/venv/site-packages/grpc/_channel.py"


@pytest.mark.parametrize("message, function, filename, dropped", [
    ("Cannot monitor channel state: Channel closed!", "_poll_connectivity", GRPC_CHANNEL, True),
    ("Cannot invoke RPC: Channel closed!", "_poll_connectivity", GRPC_CHANNEL, True),
    ("Cannot monitor channel state: Channel closed!", "_poll_connectivity", "/srv/speckv/mine.py", False),
    ("Cannot monitor channel state: Channel closed!", "_deliver", GRPC_CHANNEL, False),
    ("some other value", "_poll_connectivity", GRPC_CHANNEL, False),
], ids=["watch", "read", "not grpc's file", "not the poller", "another message"])
def test_only_the_pollers_closed_channel_errors_are_dropped(message: str, function: str, filename: str,
                                                            dropped: bool) -> None:
    args = _hook_args(message, function, filename)
    assert is_closed_channel_poller(args) is dropped
    passed_on: list[threading.ExceptHookArgs] = []
    quieting(passed_on.append)(args)
    assert passed_on == ([] if dropped else [args])
