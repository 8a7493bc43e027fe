"""Durations and cut-off times for flags such as ``--older-than 5d``."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from compactor.errors import UsageError

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")

DAY_MS = _UNIT_MS["d"]


def duration_ms(text: str) -> int | None:
    """``30m`` -> 1800000; None when ``text`` is not a duration."""
    match = _DURATION.match(text)
    return int(float(match.group(1)) * _UNIT_MS[match.group(2)]) if match else None


def parse_duration_ms(text: str, setting: str) -> int:
    """A duration such as ``90s``, ``30m``, ``12h``, ``5d``, ``2w`` in ms; ``setting`` names it."""
    ms = duration_ms(text)
    if ms is None:
        raise UsageError(f"{setting}: {text!r} is not a duration (examples: 90s, 30m, 12h, 5d, 2w)")
    return ms


def parse_cutoff(text: str, setting: str, now_ms: int) -> int:
    """A cut-off in epoch ms from a duration before now (``5d``, ``12h``) or an ISO timestamp."""
    ms = duration_ms(text)
    if ms is not None:
        return now_ms - ms
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"{setting} {text!r}: expected a duration (30m, 12h, 5d, 2w) or an ISO timestamp "
            "(2026-11-20T00:00:00+00:00)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def epoch_ms(at: float | None) -> int | None:
    """A time in epoch seconds as integer epoch milliseconds, the unit of all ``--json`` times."""
    return None if at is None else round(at * 1000)


def format_duration(ms: int) -> str:
    """``432000000`` -> ``5d``; the largest unit that divides it, else hours with a fraction."""
    for unit in ("w", "d", "h", "m", "s"):
        if ms and ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms / _UNIT_MS['h']:.2f}h"


def format_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def utc_now_text() -> str:
    """Now, as ``2026-11-23T16:40:12Z``: the time stamp of progress lines."""
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
