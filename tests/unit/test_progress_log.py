"""Progress lines of runs that cannot draw a bar: when, and what they say."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from compactor.bench.progress import LogSteps
from compactor.errors import UsageError
from compactor.execute.progress_log import ProgressLog, progress_interval

MiB = 1024 * 1024


def test_progress_lines_come_once_an_interval_with_files_bytes_rate_and_time_left() -> None:
    now = [0.0]
    lines: list[tuple[str, dict[str, Any]]] = []
    progress = ProgressLog("db.t", lambda *line: lines.append(line), 30, lambda: now[0])
    plan = SimpleNamespace(input_files=40, input_bytes=400 * MiB)
    progress.start(plan)  # type: ignore[arg-type]

    for moment, files, size in ((10, 10, 100 * MiB), (30, 10, 100 * MiB), (45, 10, 100 * MiB)):
        now[0] = moment
        progress.advance(files, size)

    assert lines == [
        (
            "db.t: 20 of 40 files, 200.0 MiB of 400.0 MiB (50%), 6.7 MiB/s, about 30s left",
            {
                "table": "db.t",
                "files_done": 20,
                "files_total": 40,
                "bytes_done": 200 * MiB,
                "bytes_total": 400 * MiB,
                "bytes_per_second": 200 * MiB // 30,
                "elapsed_ms": 30_000,
            },
        )
    ]
    now[0] = 60.0
    progress.advance(10, 100 * MiB)
    assert lines[-1][0] == "db.t: 40 of 40 files, 400.0 MiB of 400.0 MiB (100%), 6.7 MiB/s"


@pytest.mark.parametrize(("text", "seconds"), [("", 30.0), ("0", 0.0), (" 2.5 ", 2.5)])
def test_progress_interval_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str, seconds: float
) -> None:
    monkeypatch.setenv("COMPACTOR_PROGRESS_INTERVAL", text)
    assert progress_interval() == seconds


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_bad_progress_interval_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("COMPACTOR_PROGRESS_INTERVAL", text)
    with pytest.raises(UsageError, match="COMPACTOR_PROGRESS_INTERVAL="):
        progress_interval()


def test_benchmark_steps_off_a_terminal_are_a_line_when_they_start_and_end() -> None:
    buffer = io.StringIO()
    now = [100.0]
    steps = LogSteps(Console(file=buffer, width=200), lambda: now[0])

    with steps.step("loading tables", total=16) as advance:
        advance(16)
        now[0] = 127.25
    steps.note("loaded 16 tables")

    lines = [line.split(" ", 1) for line in buffer.getvalue().splitlines()]
    assert [text for _, text in lines] == [
        "loading tables ...",
        "loading tables: done in 27.2 s",
        "loaded 16 tables",
    ]
    assert all(moment.endswith("Z") and "T" in moment for moment, _ in lines)
