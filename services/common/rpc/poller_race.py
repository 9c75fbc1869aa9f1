"""grpc-python's connectivity poller racing a channel's close.

`channel.subscribe` starts a daemon thread that reads the channel's state
and then watches it in 0.2 s steps, checking for subscribers only after each
step. A channel closed right after subscribe (the scheduler's event stream to
a node that is down fails at once, and its channel is closed with the watch)
makes the next read or watch raise in grpc's own thread:
`ValueError: Cannot monitor channel state: Channel closed!` from a watch,
`ValueError: Cannot invoke RPC: Channel closed!` from a read. Nothing is
lost: the thread was about to stop, the channel is closed on purpose. But
the exception reaches `threading.excepthook`, which prints a traceback into
the service's log, where an operator (and `bench chaos`'s hygiene check)
rightly reads a traceback as a bug.

`quiet_closed_channel_pollers` installs a hook that drops exactly those
exceptions, raised in grpc's `_poll_connectivity`, with a DEBUG line; every
other thread exception goes to the hook that was there before. It is for a
process's entry point (it replaces a process-wide hook), never for a core.
"""
from __future__ import annotations

import logging
import threading
import traceback
from typing import Callable

log = logging.getLogger(__name__)

POLLER_FUNCTION = "_poll_connectivity"
CLOSED_MESSAGES = ("Cannot monitor channel state", "Cannot invoke RPC")

ExceptHook = Callable[[threading.ExceptHookArgs], object]


def is_closed_channel_poller(args: threading.ExceptHookArgs) -> bool:
    """True for grpc's poller thread finding its channel closed; False for
    anything else (another ValueError, the same text raised elsewhere)."""
    if args.exc_type is not ValueError or not str(args.exc_value).startswith(CLOSED_MESSAGES):
        return False
    frames = traceback.extract_tb(args.exc_traceback)
    return any(frame.name == POLLER_FUNCTION and "grpc" in frame.filename for frame in frames)


def quieting(previous: ExceptHook) -> ExceptHook:
    """A thread excepthook that drops the poller race and passes every other
    exception to previous."""

    def hook(args: threading.ExceptHookArgs) -> None:
        if is_closed_channel_poller(args):
            log.debug("grpc connectivity poller stopped on a closed channel (%s)", args.exc_value)
            return
        previous(args)

    hook.quiets_pollers = True  # type: ignore[attr-defined]
    return hook


def quiet_closed_channel_pollers() -> None:
    """Installs the quieting hook over the current one; a second call is a no-op."""
    if getattr(threading.excepthook, "quiets_pollers", False):
        return
    threading.excepthook = quieting(threading.excepthook)
