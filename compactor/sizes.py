"""Byte sizes: parsing ``128MB``/``512MiB``/``1048576``, printing them back, and this process's
resident memory."""

from __future__ import annotations

import contextlib
import re
import resource
from pathlib import Path

from compactor.errors import UsageError

MiB = 2**20
GiB = 2**30
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "K": 2**10,
    "M": 2**20,
    "G": 2**30,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int, setting: str = "size") -> int:
    """Parse ``text`` as a byte count; ``setting`` names the flag or property in errors."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(
            f"{setting}: cannot read {text!r} as a size (examples: 128MB, 512MiB, 1048576)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


# Largest first; a binary unit before the decimal one of the same rank.
_EXACT_UNITS = (
    ("TiB", 2**40),
    ("TB", 10**12),
    ("GiB", 2**30),
    ("GB", 10**9),
    ("MiB", 2**20),
    ("MB", 10**6),
    ("KiB", 2**10),
    ("KB", 10**3),
)


def format_size_exact(num_bytes: int) -> str:
    """Format a byte count exactly in the largest unit that divides it: ``64MB``, ``512MiB``.

    :func:`parse_size` reads the result back to the same count.
    """
    for unit, factor in _EXACT_UNITS:
        if num_bytes and num_bytes % factor == 0:
            return f"{num_bytes // factor}{unit}"
    return str(num_bytes)


def format_size(num_bytes: float) -> str:
    """Format a byte count with binary units, e.g. ``1.5 MiB``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# This process's resident memory, as the kernel counts it.
PROC_STATUS = Path("/proc/self/status")


def proc_status_bytes(name: str) -> int | None:
    """``VmRSS`` or ``VmHWM`` of this process, where the kernel tells it (Linux); else None.

    ``VmHWM`` is the peak of this program's own memory: unlike ``ru_maxrss``, it does not count
    the memory of the process it was forked from before ``exec``.
    """
    with contextlib.suppress(OSError):
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1]) * 1024
    return None


def peak_rss_bytes() -> int:
    """The peak resident memory of this process so far (elsewhere than Linux, its lifetime's)."""
    peak = proc_status_bytes("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 if peak is None else peak


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``3,000 files``, ``1 file``, ``2 orphans``: a number and its noun, in the right number."""
    return f"{number:,} {noun if number == 1 else plural or noun + 's'}"
