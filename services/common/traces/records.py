"""The request record every trace loader produces."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from speckv.services.common.errors import InvalidArgument, NotFound

DEFAULT_TRACES_DIR = "../shared/traces"


class TraceFormatError(InvalidArgument):
    """A malformed row; the message names the file and the line."""

    def __init__(self, path: Path | str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request. Times in seconds from the trace's start; block_hashes are
    the chained ids of the prompt's blocks (block_tokens tokens each; the last
    one may be partial), empty when the trace has no prefix information.
    follow_ups: requests its caller announces will follow it with its prompt
    as their prefix (an agent's sub-agents, a tool call's return), 0 when
    none is said; the public traces say none, a synthetic agent workload
    does, and a router reports it with the turn's end (TurnEnd.follow_ups)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    block_tokens: int
    family: str
    follow_ups: int = 0

    @property
    def full_blocks(self) -> int:
        """Blocks that are full, hence immutable and shareable."""
        if not self.block_tokens:
            return 0
        return min(len(self.block_hashes), self.prompt_tokens // self.block_tokens)


def resolve_traces_dir(flag: str | None, environ: Mapping[str, str]) -> Path:
    """--traces, else SPECKV_TRACES, else ../shared/traces; must exist."""
    path = Path(flag or environ.get("SPECKV_TRACES") or DEFAULT_TRACES_DIR)
    if not path.is_dir():
        raise NotFound(f"traces directory {path} does not exist; pass --traces DIR or set SPECKV_TRACES "
                       f"(README.md says where the public traces come from)")
    return path
