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


class ConfigProblems(ConfigError):
    """Every problem of one file, each ``file:line: setting: why``; its message is the first
    (one line, as every error), saying how many more there are."""

    def __init__(self, problems: list[str]) -> None:
        more = len(problems) - 1
        hint = f" (and {more} more: `compactor jobs validate` lists them all)" if more else ""
        super().__init__(problems[0] + hint)
        self.problems = problems


def _key_named_by(data: Any, loc: tuple[str | int, ...], message: str) -> tuple[str | int, ...]:
    """``loc`` extended by the key a section-wide check's ``message`` starts with (``ray_address
    '...': is only used with ...``), so that the problem points at that key's line."""
    section = data
    for part in loc:
        section = section.get(part) if isinstance(section, dict) else None
    first = message.split(" ", 1)[0]
    return (*loc, first) if isinstance(section, dict) and first in section else loc


def validate(model: type[Model], data: dict[str, Any], source: str, path: Path) -> Model:
    """``model`` from ``data``; every problem becomes a line ``file:line: setting: why`` of a
    :class:`ConfigProblems`, the line that of the offending key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = "unknown setting"
            elif error["type"] == "missing":
                message = "required setting is missing"
            loc = error["loc"]
            setting = ".".join(str(part) for part in loc) or "(file)"
            line = line_of(source, _key_named_by(data, loc, message))
            problems.append(f"{_where(path, line)}: {setting}: {message}")
        raise ConfigProblems(problems) from None
