"""A run's progress as periodic one-line log messages, where no progress bar can be drawn."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from compactor.errors import UsageError
from compactor.sizes import count, format_size

if TYPE_CHECKING:
    from compactor.planning.planner import Plan

# Seconds between two progress lines; COMPACTOR_PROGRESS_INTERVAL overrides (0: every advance).
DEFAULT_INTERVAL_S = 30.0
INTERVAL_VARIABLE = "COMPACTOR_PROGRESS_INTERVAL"

Emit = Callable[[str, dict[str, Any]], None]


def progress_interval() -> float:
    """Seconds between progress lines, from the environment or the default."""
    text = os.environ.get(INTERVAL_VARIABLE, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also refuses nan
        raise UsageError(
            f"{INTERVAL_VARIABLE}={text!r}: give seconds between progress lines, e.g. 30 or 0"
        )
    return seconds


class ProgressLog:
    """Emits ``table: N of M files, X of Y (P%), R/s, about T left`` at most once an interval.

    ``emit`` gets the message and the same figures as fields (for structured logs); ``clock``
    is monotonic seconds.
    """

    def __init__(
        self,
        table: str,
        emit: Emit,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table, self.emit, self.interval_s, self.clock = table, emit, interval_s, clock
        self.total_files = self.total_bytes = self.files = self.bytes = 0
        self.started = self.last = 0.0

    def start(self, plan: Plan) -> None:
        self.total_files, self.total_bytes = plan.input_files, plan.input_bytes
        self.started = self.last = self.clock()

    def advance(self, input_files: int, input_bytes: int) -> None:
        self.files += input_files
        self.bytes += input_bytes
        now = self.clock()
        if now - self.last >= self.interval_s:
            self.last = now
            self.emit(*self._line(now - self.started))

    def _line(self, elapsed_s: float) -> tuple[str, dict[str, Any]]:
        rate = self.bytes / elapsed_s if elapsed_s > 0 else 0.0
        share = self.bytes / self.total_bytes if self.total_bytes else 1.0
        left_s = (self.total_bytes - self.bytes) / rate if rate else None
        message = (
            f"{self.table}: {self.files:,} of {count(self.total_files, 'file')}, "
            f"{format_size(self.bytes)} of {format_size(self.total_bytes)} ({share:.0%}), "
            f"{format_size(rate)}/s"
        )
        if left_s is not None and self.bytes < self.total_bytes:
            message += f", about {_minutes(left_s)} left"
        fields = {
            "table": self.table,
            "files_done": self.files,
            "files_total": self.total_files,
            "bytes_done": self.bytes,
            "bytes_total": self.total_bytes,
            "bytes_per_second": int(rate),
            "elapsed_ms": int(elapsed_s * 1000),
        }
        return message, fields


def _minutes(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``7500`` -> ``2h05m``."""
    whole = max(1, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
