"""``compactor demo``: fragment a sample table, compact it, and show what changed."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import duckdb
from rich.console import Console
from rich.progress import Progress
from rich.table import Table as RichTable

from compactor.api import compact
from compactor.bench.sample import create_events_table
from compactor.iceberg.catalogs import compactor_home, embedded_catalog
from compactor.iceberg.duckdb_views import create_view
from compactor.options import resolve_options
from compactor.planning.health import TableHealth, table_health
from compactor.sizes import count, format_size

DEMO_TABLE = "demo.events"
DEMO_QUERY = """
SELECT region, CAST(ts AS DATE) AS day, count(*) AS events,
       round(sum(amount), 2) AS amount, count(DISTINCT user_id) AS users
FROM events GROUP BY ALL ORDER BY ALL
"""
QUERY_RUNS = 5


def _time_query(con: duckdb.DuckDBPyConnection) -> tuple[float, list[tuple[Any, ...]]]:
    timings, rows = [], []
    for _ in range(QUERY_RUNS):
        started = time.perf_counter()
        rows = con.execute(DEMO_QUERY).fetchall()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings), rows


def _compare(
    before: TableHealth, after: TableHealth, t_before: float, t_after: float, files: tuple[int, int]
) -> RichTable:
    table = RichTable(title=f"{DEMO_TABLE}: before and after compaction")
    for column in ("", "before", "after"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("data files", str(before.data_files), str(after.data_files))
    table.add_row("data bytes", format_size(before.data_bytes), format_size(after.data_bytes))
    table.add_row(
        "average file size",
        format_size(before.average_file_size),
        format_size(after.average_file_size),
    )
    table.add_row("records", str(before.records), str(after.records))
    table.add_row("files the query opens", str(files[0]), str(files[1]))
    table.add_row(
        f"query time (median of {QUERY_RUNS})",
        f"{t_before * 1000:.0f} ms",
        f"{t_after * 1000:.0f} ms",
    )
    return table


def run_demo(
    console: Console, *, commits: int, rows_per_commit: int, on_error: Callable[[str], None]
) -> None:
    """Build ``demo.events`` in the embedded catalog, compact it, and print before/after."""
    catalog = embedded_catalog()
    console.print(f"embedded catalog and warehouse: {compactor_home()}")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"writing {DEMO_TABLE} in {commits} small commits", total=commits)
        table = create_events_table(
            catalog,
            DEMO_TABLE,
            commits=commits,
            rows_per_commit=rows_per_commit,
            on_commit=lambda _: progress.advance(task),
        )
    options = resolve_options(DEMO_TABLE, table.metadata.properties)
    before = table_health(table, DEMO_TABLE, options.target_file_size)
    console.print(
        f"{DEMO_TABLE}: {count(before.data_files, 'file')}, {format_size(before.data_bytes)}, "
        f"average {format_size(before.average_file_size)} over {count(before.snapshots, 'snapshot')}"
    )
    con = duckdb.connect()
    files_before = create_view(con, "events", table)
    t_before, rows_before = _time_query(con)

    console.print(f"$ compactor run --table {DEMO_TABLE}")
    result = compact(table, options).to_dict()
    console.print(
        f"committed replace snapshot {result['snapshot_id']}: {count(result['rewritten_files'], 'file')} -> "
        f"{result['added_files']} in {result['duration_ms'] / 1000:.1f}s "
        f"({result['rewritten_bytes'] / 2**20 / max(result['duration_ms'] / 1000, 1e-3):.0f} MiB/s)"
    )
    table = catalog.load_table(DEMO_TABLE)
    after = table_health(table, DEMO_TABLE, options.target_file_size)
    files_after = create_view(con, "events", table)
    t_after, rows_after = _time_query(con)
    console.print(_compare(before, after, t_before, t_after, (files_before, files_after)))
    if rows_before != rows_after:
        on_error(f"table {DEMO_TABLE}: the demo query returned different results after compaction")
        return
    console.print(
        f"same {len(rows_after)} result rows before and after; query {t_before / t_after:.1f}x faster. "
        f"Try: COMPACTOR_HOME={compactor_home()} compactor inspect --table {DEMO_TABLE}"
    )
