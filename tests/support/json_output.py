"""The ``--json`` documents checked against the fields and types docs/json-output.md lists."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from support import REPOSITORY

JSON_OUTPUT_DOC = REPOSITORY / "docs" / "json-output.md"


def documented_fields(command: str, doc: Path = JSON_OUTPUT_DOC) -> dict[str, str]:
    """The fields docs/json-output.md lists for ``compactor COMMAND --json``: path -> type (or
    those ``doc`` lists under the heading ``COMMAND``, e.g. ``GET /api/v1/runs``)."""
    text = doc.read_text()
    heading = f"compactor {command}" if doc == JSON_OUTPUT_DOC else command
    section = re.search(rf"^## `{re.escape(heading)}`$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, f"{doc.name} has no section for {heading}"
    rows = re.finditer(r"^\| `([^`]+)` +\| ([^|]+?) +\|", section[1], re.M)
    return {row[1]: row[2] for row in rows}


def _has_type(value: Any, kind: str) -> bool:
    """Whether ``value`` is of the documented type ``kind``, e.g. ``list of string or null``."""
    if " or " in kind:
        return any(_has_type(value, option) for option in kind.split(" or "))
    outer, _, inner = kind.partition(" of ")
    if outer == "list":
        return isinstance(value, list) and all(_has_type(v, inner) for v in value)
    if outer == "map":
        return isinstance(value, dict) and all(_has_type(v, inner) for v in value.values())
    simple = {"null": type(None), "string": str, "integer": int, "boolean": bool, "record": dict}
    if outer == "number":
        return type(value) in (int, float)
    return type(value) is simple[outer]


def assert_documented(command: str, document: dict[str, Any], doc: Path = JSON_OUTPUT_DOC) -> None:
    """``document``, printed by ``compactor COMMAND --json``, has exactly the fields (nested
    ones as ``a.b`` and ``a[].b``) and the types docs/json-output.md lists for the command (or
    ``doc`` for the heading ``COMMAND``)."""
    fields = documented_fields(command, doc)
    seen, opened = set(), {""}

    def walk(record: dict[str, Any], prefix: str) -> None:
        for key, value in record.items():
            path = prefix + key
            assert path in fields, f"compactor {command} --json: {path} is not documented"
            assert _has_type(value, fields[path]), f"{path}: {value!r} is not {fields[path]}"
            seen.add(path)
            if fields[path].startswith("record") and isinstance(value, dict):
                opened.add(path)
                walk(value, path + ".")
            elif fields[path].startswith("list of record"):
                for item in value:
                    opened.add(path + "[]")
                    walk(item, path + "[].")

    walk(document, "")
    expected = {path for path in fields if re.sub(r"\.?[^.]+$", "", path) in opened}
    assert expected <= seen, f"compactor {command} --json lacks {sorted(expected - seen)}"
