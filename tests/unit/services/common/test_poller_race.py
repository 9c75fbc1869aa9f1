"""grpc's connectivity poller, racing a channel closed right after subscribe,
raises in its own thread; a process with the quieting hook logs no traceback
for it, and still prints every other thread's exception. Each case runs in a
fresh interpreter: the hook is process-wide, and pytest swaps the thread hook
during a test."""
from __future__ import annotations

import subprocess
import sys
import textwrap

RACE = textwrap.dedent("""
    import threading, time
    import grpc
    from speckv.services.common.poller_race import quiet_closed_channel_pollers
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
