"""Progress lines of runs that cannot draw a bar: when, and what they say."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from helpers import DEFAULT_OPTIONS
from pyiceberg.catalog import Catalog
from rich.console import Console

from compactor.bench.progress import LogSteps
from compactor.compaction import compact_table
from compactor.errors import UsageError
from compactor.execute.progress_log import ProgressLog, progress_interval
from compactor.options import resolve_options

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


class Recorded:
    """A run's progress, as told."""

    def __init__(self) -> None:
        self.plan: Any = None
        self.advances: list[tuple[int, int]] = []

    def start(self, plan: Any) -> None:
        self.plan = plan

    def advance(self, input_files: int, input_bytes: int) -> None:
        self.advances.append((input_files, input_bytes))


@pytest.mark.parametrize("bulk_read", [False, True])
def test_progress_moves_while_a_group_reads_its_files(catalog: Catalog, bulk_read: bool) -> None:
    """One long group (a 20 GB table is one) must not look stuck until it finishes."""
    table = catalog.create_table("db.t", pa.schema([("id", pa.int64())]))
    for start in range(0, 50, 10):
        table.append(pa.table({"id": pa.array(range(start, start + 10), pa.int64())}))
    options = resolve_options(
        "db.t", table.metadata.properties, **{**DEFAULT_OPTIONS, "bulk_read": bulk_read}
    )
    recorded = Recorded()

    result = compact_table(table, options, progress=recorded)

    assert result.to_dict()["rewritten_files"] == 5
    (group,) = result.plan.groups
    sizes = [f.size for f in group.files]
    if bulk_read:  # one run of five files, read in bulk, then the group's end
        assert recorded.advances == [(5, sum(sizes)), (0, 0)]
    else:  # each file as it is read, then the group's end
        assert recorded.advances == [(1, size) for size in sizes] + [(0, 0)]
    assert recorded.plan.input_bytes == sum(sizes)


@pytest.mark.parametrize("bulk_read", [False, True])
def test_a_sorted_group_is_half_done_when_read_and_done_when_written(
    catalog: Catalog, bulk_read: bool
) -> None:
    """A sort reads every input before it writes a row: its progress must not stand at 100%
    through the merge. Reading counts half the bytes, writing the sorted rows the rest."""
    table = catalog.create_table("db.t", pa.schema([("id", pa.int64())]))
    for start in range(0, 5000, 1000):
        ids = pa.array(reversed(range(start, start + 1000)), pa.int64())
        table.append(pa.table({"id": ids}))
    options = resolve_options(
        "db.t",
        table.metadata.properties,
        **{**DEFAULT_OPTIONS, "bulk_read": bulk_read, "strategy": "sort", "sort_order": "id"},
    )
    recorded = Recorded()

    result = compact_table(table, options, progress=recorded)

    assert result.to_dict()["rewritten_files"] == 5
    total = recorded.plan.input_bytes
    read = [size for files, size in recorded.advances if files > 0]
    written = [size for files, size in recorded.advances if files == 0 and size > 0]
    assert sum(files for files, _ in recorded.advances) == 5
    assert 0 < sum(read) <= total / 2  # all read, half done: the merge is still to come
    assert written and sum(read) + sum(written) == total  # done once the rows are written
    assert recorded.advances[-1] == (0, 0)  # told as the rows were written, not at the end
