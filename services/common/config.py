"""One validated configuration object per service, from flags and SPECKV_*
environment variables (flag beats variable beats default).

A config is a frozen dataclass whose fields carry their help text in
`field(metadata={"help": ...})`; the flag is `--field-name` and the variable
`SPECKV_FIELD_NAME`. The environ mapping is passed in, never read at import
time. `validate()` on the dataclass raises InvalidArgument naming the field.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar, get_type_hints

from speckv.services.common.errors import InvalidArgument

C = TypeVar("C")
# The committed configuration files (services/config/*.json), shipped as package data.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_name(field_name: str) -> str:
    return "SPECKV_" + field_name.upper()


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Adds one optional flag per field of cls; absent flags stay None."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata.get('help', '')} [env {env_name(f.name)}; default {_default(f)!r}]"
        if hints[f.name] is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, help=help_text, metavar=f.name.upper())


def config_from(cls: type[C], args: argparse.Namespace | None, environ: Mapping[str, str]) -> C:
    """Builds and validates cls from parsed flags, then environ, then defaults."""
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        raw = getattr(args, f.name, None) if args is not None else None
        source = f"--{f.name.replace('_', '-')}"
        if raw is None and env_name(f.name) in environ:
            raw, source = environ[env_name(f.name)], env_name(f.name)
        if raw is not None:
            values[f.name] = _convert(raw, hints[f.name], source)
    config = cls(**values)
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config


def parse_config(cls: type[C], argv: Sequence[str], environ: Mapping[str, str], prog: str) -> C:
    parser = argparse.ArgumentParser(prog=prog)
    add_config_arguments(parser, cls)
    return config_from(cls, parser.parse_args(list(argv)), environ)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _convert(raw: Any, kind: Any, source: str) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
            raise ValueError(raw)
        if kind in (int, float):
            return kind(raw)
    except ValueError:
        raise InvalidArgument(f"{source}={raw!r} is not a valid {kind.__name__}") from None
    return raw


def check_port(name: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise InvalidArgument(f"{name}={port}: a port is 0..65535 (0 picks a free one)")


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise InvalidArgument(f"{name}={value}: must be > 0")
