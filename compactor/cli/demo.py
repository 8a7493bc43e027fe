"""``compactor demo``: fragment a sample table, compact it, and show what changed."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from compactor.cli.output import guarded, out, print_table
from compactor.errors import CompactorError
from compactor.sizes import count, format_size

if TYPE_CHECKING:
    import duckdb

    from compactor.planning.health import TableHealth

# duckdb, pyiceberg and what is built on them are imported when the demo runs, not with the CLI.

DEMO_TABLE = "demo.events"
DEMO_QUERY = """
SELECT region, CAST(ts AS DATE) AS day, count(*) AS events,
       round(sum(amount), 2) AS amount, count(DISTINCT user_id) AS users
FROM events GROUP BY ALL ORDER BY ALL
"""
QUERY_RUNS = 5

commands = typer.Typer()


@commands.command()
@guarded
def demo(
    commits: Annotated[
        int, typer.Option(help="Small commits to write into the sample table.")
    ] = 200,
    rows_per_commit: Annotated[int, typer.Option(help="Rows in each commit.")] = 2500,
) -> None:
    """Build a fragmented sample table (demo.events) in the embedded catalog, compact it, show the gain.

    Uses $COMPACTOR_HOME (default ~/.local/share/compactor); `make demo` points it at .compactor-demo/.
    """
    run_demo(commits=commits, rows_per_commit=rows_per_commit)


def _time_query(con: duckdb.DuckDBPyConnection) -> tuple[float, list[tuple[Any, ...]]]:
    timings, rows = [], []
    for _ in range(QUERY_RUNS):
        started = time.perf_counter()
        rows = con.execute(DEMO_QUERY).fetchall()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings), rows


def _print_comparison(
    before: TableHealth, after: TableHealth, t_before: float, t_after: float, files: tuple[int, int]
) -> None:
    print_table(
        f"{DEMO_TABLE}: before and after compaction",
        ("", "before", "after"),
        [
            ("data files", str(before.data_files), str(after.data_files)),
            ("data bytes", format_size(before.data_bytes), format_size(after.data_bytes)),
            (
                "average file size",
                format_size(before.average_file_size),
                format_size(after.average_file_size),
            ),
            ("records", str(before.records), str(after.records)),
            ("files the query opens", str(files[0]), str(files[1])),
            (
                f"query time (median of {QUERY_RUNS})",
                f"{t_before * 1000:.0f} ms",
                f"{t_after * 1000:.0f} ms",
            ),
        ],
        right=("before", "after"),
    )


def run_demo(*, commits: int, rows_per_commit: int) -> None:
    """Build ``demo.events`` in the embedded catalog, compact it, and print before/after."""
    import duckdb
    from rich.progress import Progress

    from compactor.api import compact
    from compactor.bench.sample import create_events_table
    from compactor.iceberg.catalogs import compactor_home, embedded_catalog
    from compactor.iceberg.duckdb_views import create_view
    from compactor.options import resolve_options
    from compactor.planning.health import table_health

    catalog = embedded_catalog()
    out.print(f"embedded catalog and warehouse: {compactor_home()}")
    with Progress(console=out, transient=True) as progress:
        task = progress.add_task(f"writing {DEMO_TABLE} in {commits} small commits", total=commits)
        table = create_events_table(
            catalog,
            DEMO_TABLE,
            commits=commits,
            rows_per_commit=rows_per_commit,
            on_commit=lambda _: progress.advance(task),
        )
    options = resolve_options(DEMO_TABLE, table.metadata.properties)
    before = table_health(table, DEMO_TABLE, options.plan.target_file_size)
    out.print(
        f"{DEMO_TABLE}: {count(before.data_files, 'file')}, {format_size(before.data_bytes)}, "
        f"average {format_size(before.average_file_size)} over {count(before.snapshots, 'snapshot')}"
    )
    con = duckdb.connect()
    files_before = create_view(con, "events", table)
    t_before, rows_before = _time_query(con)

    out.print(f"$ compactor run --table {DEMO_TABLE}")
    result = compact(table, options)
    seconds = result.duration_ms / 1000
    out.print(
        f"committed replace snapshot {result.snapshot_id}: "
        f"{count(len(result.rewritten_files), 'file')} -> {len(result.added_files)} in {seconds:.1f}s "
        f"({result.rewritten_bytes / 2**20 / max(seconds, 1e-3):.0f} MiB/s)"
    )
    table = catalog.load_table(DEMO_TABLE)
    after = table_health(table, DEMO_TABLE, options.plan.target_file_size)
    files_after = create_view(con, "events", table)
    t_after, rows_after = _time_query(con)
    _print_comparison(before, after, t_before, t_after, (files_before, files_after))
    if rows_before != rows_after:
        raise CompactorError(
            f"table {DEMO_TABLE}: the demo query returned different results after compaction"
        )
    out.print(
        f"same {len(rows_after)} result rows before and after; query {t_before / t_after:.1f}x faster. "
        f"Try: COMPACTOR_HOME={compactor_home()} compactor inspect --table {DEMO_TABLE}"
    )
