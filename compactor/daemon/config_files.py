"""Read the daemon's TOML files; every error names the file and, where it can, the line."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from compactor.errors import ConfigError

Model = TypeVar("Model", bound=BaseModel)

_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.\-\s\"]+?)\s*=")
_SYNTAX_POSITION = re.compile(r"\(at line (\d+), column \d+\)")


def _dotted(text: str) -> tuple[str, ...]:
    return tuple(part.strip().strip('"') for part in text.split("."))


def line_of(source: str, loc: Sequence[str | int]) -> int | None:
    """The 1-based line where the setting at ``loc`` (e.g. ``("compact", "every")``) is written.

    Falls back to the line of the innermost enclosing section; None when nothing matches.
    """
    path = tuple(part for part in loc if isinstance(part, str))
    best: tuple[int, int] | None = None  # (matched depth, line)
    section: tuple[str, ...] = ()
    for number, text in enumerate(source.splitlines(), start=1):
        header = _HEADER.match(text)
        if header:
            section = _dotted(header.group(1))
            full = section
        else:
            key = _KEY.match(text)
            if not key:
                continue
            full = section + _dotted(key.group(1))
        depth = len(full)
        if full == path[:depth] and (best is None or depth > best[0]):
            best = (depth, number)
    return best[1] if best else None


def _where(path: Path, line: int | None) -> str:
    return f"{path}:{line}" if line else str(path)


def load_toml(path: Path) -> tuple[dict[str, Any], str]:
    """Parse ``path``; a missing file or a syntax error is a ConfigError naming file and line."""
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        return tomllib.loads(source), source
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        position = _SYNTAX_POSITION.search(message)
        line = int(position.group(1)) if position else None
        reason = _SYNTAX_POSITION.sub("", message).strip()
        raise ConfigError(f"{_where(path, line)}: invalid TOML: {reason}") from None


def validate(model: type[Model], data: dict[str, Any], source: str, path: Path) -> Model:
    """``model`` from ``data``; the first problem becomes a ConfigError ``file:line: setting: why``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = error["loc"]
        setting = ".".join(str(part) for part in loc) or "(file)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown setting"
        elif error["type"] == "missing":
            message = "required setting is missing"
        raise ConfigError(f"{_where(path, line_of(source, loc))}: {setting}: {message}") from None
