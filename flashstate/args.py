"""Command-line flags → EngineConfig, built from its fields (config.py `flag`): each field is the flag
`--field-name` with `dest` the field, so a flag is written once and lands in the config once
(`config_from_args`). Type and choices come from the annotation, help and group from the field's metadata,
and every --help line shows the default. Names follow `vllm serve` where the meaning is the same; sizes accept
vLLM's human-readable forms (`32k` = 32000, `32K` = 32768, `1.5G`, `8Gi`)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from flashstate.config import FIELD_CHOICES, EngineConfig

_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(i?)[bB]?\s*$")


def human_readable_int(value: str) -> int:
    """'2048' → 2048, '32k' → 32000, '32K' or '32Ki' → 32768, '1.5G' → 1610612736 (vLLM's convention:
    lower case is decimal, upper case or an `i` is binary)."""
    m = _SIZE.match(value)
    if m is None:
        raise argparse.ArgumentTypeError(f"not an integer size: {value!r}")
    number, unit, binary = m.groups()
    scale = _BINARY[unit.upper()] if (unit.isupper() or binary) and unit else _DECIMAL[unit.lower()]
    result = float(number) * scale
    if result != int(result):
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number")
    return int(result)


def _aliased(aliases: dict[str, str]) -> Callable[[str], str]:
    def convert(value: str) -> str:
        return aliases.get(value, value)

    return convert


def _shown(f: dataclasses.Field) -> str:
    """The default as --help shows it."""
    value = f.default
    if f.metadata["shown"] is not None:
        text = f.metadata["shown"]
    elif isinstance(value, bool):
        text = "on" if value else "off"
    elif value is None:
        text = "none"
    elif isinstance(value, tuple):
        text = " ".join(map(str, value))  # as the values are given on the command line
    elif f.metadata["size"] and value and value % _BINARY["M"] == 0:
        unit = next(u for u in "TGM" if value % _BINARY[u] == 0)
        text = f"{value // _BINARY[unit]}{unit}i"
    else:
        text = str(value)
    return text.replace("%", "%%")


def _argument(f: dataclasses.Field, hint: Any) -> tuple[list[str], dict[str, Any]]:
    """The option strings and add_argument keywords of the field `f` annotated `hint`."""
    meta = f.metadata
    kwargs: dict[str, Any] = {
        "dest": f.name,
        "default": f.default,
        "help": f"{meta['help']} (default: {_shown(f)})",
    }
    if meta["metavar"] is not None:
        kwargs["metavar"] = meta["metavar"]
    kind = get_args(hint)[0] if get_origin(hint) in (Union, UnionType) else hint  # `X | None`: X
    if f.name in FIELD_CHOICES:
        kwargs["choices"] = [v for v in FIELD_CHOICES[f.name] if v is not None]
        if meta["value_aliases"]:
            kwargs["type"] = _aliased(meta["value_aliases"])
    elif kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif get_origin(kind) is tuple:
        item, *rest = get_args(kind)
        kwargs["type"] = item
        kwargs["nargs"] = "+" if rest == [Ellipsis] else len(rest) + 1
    elif kind is int:
        kwargs["type"] = human_readable_int if meta["size"] else int
    elif kind is float:
        kwargs["type"] = float
    return [f"--{f.name.replace('_', '-')}", *meta["aliases"]], kwargs


def _add_groups(p: argparse.ArgumentParser, *titles: str) -> None:
    """A group per title, of the EngineConfig fields in it (all but those marked internal), in their order."""
    hints = get_type_hints(EngineConfig)
    for title in titles:
        g = p.add_argument_group(title)
        for f in dataclasses.fields(EngineConfig):
            if not f.metadata.get("internal") and f.metadata["group"] == title:
                names, kwargs = _argument(f, hints[f.name])
                g.add_argument(*names, **kwargs)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Model, memory and batching flags (every subcommand that runs the engine)."""
    _add_groups(p, "engine")


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """Prefix cache and host tier flags (DESIGN.md §2–3)."""
    _add_groups(p, "prefix cache", "host tier")


def add_server_args(p: argparse.ArgumentParser) -> None:
    _add_groups(p, "server")


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Every parsed flag whose dest names an EngineConfig field; raises ValueError for a bad value."""
    values = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig) if hasattr(args, f.name)
    }
    return EngineConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
