"""ReloadModel's model root: a candidate model is named, never given as a path.

The predictor's config names one directory, the model root (--model-root);
ReloadModel takes a name and loads the model directory root/name. Invariants
of a directory resolve_model_name returns:

- name is one path component matching NAME_PATTERN (so never '', '.', '..',
  nothing with '/', a NUL or a leading dot), checked before any file system
  access;
- the returned path is realpath(root/name) and lies strictly under
  realpath(root): a symlink in the root may point elsewhere in the root
  (`current -> v7`), never out of it;
- it is an existing directory when returned.

Errors, as domain errors (the interceptor maps them): no root configured,
or a root that is no directory, is FailedPrecondition (the server's state,
not the request); a malformed name is InvalidArgument; a name that resolves
outside the root is FailedPrecondition (the name is well formed, a symlink
in the root is what forbids it; the target is not echoed back); an absent
name is NotFound, as model_directory says for an absent path.

Left open: between the check and the probe's and the server's reads, a
writer of the root could swap a directory for a symlink. The root must be
writable only by trusted trainers (docs/predictor.md), as the booster files
and compiled trees inside it already require.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def refuse_path(path: str) -> None:
    """InvalidArgument when a ReloadModel request still sets `path` (the
    field is kept in the proto so old clients hear why, not load nothing)."""
    if path:
        raise InvalidArgument("path: ReloadModel no longer loads a path; pass name, a model directory directly "
                              "under the predictor's model root (--model-root)")


SHOWN_NAME_CHARS = 80  # of a caller's name in an error: its status must stay far below gRPC's 8 KiB metadata


def shown_name(name: str) -> str:
    """name as an error shows it: at most SHOWN_NAME_CHARS of it. A whole
    10 KB name in a status message pushed the trailer past gRPC's 8 KiB
    soft metadata limit, where the client drops the call at random
    (RESOURCE_EXHAUSTED instead of INVALID_ARGUMENT)."""
    return name if len(name) <= SHOWN_NAME_CHARS else name[:SHOWN_NAME_CHARS] + "..."


def check_name(name: str) -> None:
    """InvalidArgument unless name is one path component of NAME_PATTERN."""
    if not name:
        raise InvalidArgument("name: empty (name a model directory directly under the model root)")
    if NAME_PATTERN.fullmatch(name) is None:
        raise InvalidArgument(f"name={shown_name(name)!r}: must be one directory name under the model root, "
                              "[A-Za-z0-9][A-Za-z0-9._-]{0,127} (no '/', no '..', no leading dot)")


def resolve_model_name(root: str, name: str) -> Path:
    """realpath(root/name), checked as the module docstring says."""
    check_name(name)  # first: a malformed name is the caller's error whatever the server's state
    if not root:
        raise FailedPrecondition("ReloadModel: no model root configured (start the predictor with "
                                 "--model-root DIR to reload models by name)")
    real_root = Path(os.path.realpath(root))
    try:
        if not real_root.is_dir():
            raise FailedPrecondition("the model root (--model-root) is not a directory")  # its path: the log's
        candidate = Path(os.path.realpath(real_root / name))
        inside = candidate != real_root and candidate.is_relative_to(real_root)
        if inside and not candidate.is_dir():
            raise NotFound(f"name={name!r}: no such model directory under the model root")
    except OSError as exc:  # EACCES on the root, ELOOP, ...: the root's state, not a bug of ours
        raise FailedPrecondition(f"name={name!r}: cannot be resolved under the model root ({exc.strerror})") \
            from None
    if not inside:
        raise FailedPrecondition(f"name={name!r}: resolves outside the model root (a symlink leading out); "
                                 "refused")
    return candidate
