"""``compactor run`` and ``compactor inspect``: compact one table, or show how fragmented it is."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from compactor.cli.common import (
    BusyExitOpt,
    CatalogOpt,
    JsonOpt,
    TableOpt,
    back_off,
    open_table,
    warn_in_doubt,
)
from compactor.cli.model_flags import with_model_flags
from compactor.cli.output import err, fail, guarded, out, print_json, print_table
from compactor.durations import format_time, utc_now_text
from compactor.errors import CompactorError
from compactor.options.compact import CompactOptions
from compactor.options.defaults import DEFAULT_BRANCH
from compactor.sizes import count, format_size

if TYPE_CHECKING:
    from compactor.compaction import RunResult
    from compactor.planning.health import TableHealth
    from compactor.planning.planner import Plan

commands = typer.Typer()


class _Bar:
    """Progress bar over input bytes, on a terminal only."""

    def __init__(self) -> None:
        self._progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        )
        self._task: Any = None

    def start(self, plan: Plan) -> None:
        self._progress.start()
        self._task = self._progress.add_task(
            f"rewriting {count(len(plan.groups), 'group')}", total=plan.input_bytes
        )

    def advance(self, input_files: int, input_bytes: int) -> None:
        self._progress.advance(self._task, input_bytes)

    def stop(self) -> None:
        self._progress.stop()


def _progress_line(message: str, fields: dict[str, Any]) -> None:
    """A progress line on stderr when no bar can be drawn (stderr is not a terminal)."""
    err.print(f"{utc_now_text()} progress {message}", markup=False, highlight=False)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT while the block runs (a second SIGINT interrupts)."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT and stop.is_set():
            raise KeyboardInterrupt
        err.print(
            f"{signal.Signals(signum).name}: stopping after the current files; committing finished groups"
        )
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _warn(warnings: tuple[str, ...]) -> None:
    """Print each of the resolved options' warnings as one line on stderr."""
    for warning in warnings:
        err.print(f"warning: {warning}", markup=False, highlight=False)


def _print_plan(plan: Plan) -> None:
    print_table(
        f"plan for {plan.table} (snapshot {plan.snapshot_id})",
        ("group", "partition", "input files", "input bytes", "deletes", "expected outputs"),
        (
            (
                str(g.group_id),
                g.partition_label,
                str(len(g.files)),
                format_size(g.input_bytes),
                str(len(g.delete_files)),
                str(g.expected_output_files),
            )
            for g in plan.groups
        ),
        right=("group", "input files", "input bytes", "deletes", "expected outputs"),
        fold=("partition",),
        skip_empty=True,
    )
    skipped = ", ".join(f"{k}={v}" for k, v in sorted(plan.skipped.items())) or "none"
    out.print(
        f"{count(plan.input_files, 'file')} ({format_size(plan.input_bytes)}) in {count(len(plan.groups), 'group')} "
        f"from {plan.data_files_scanned} data files scanned; target {format_size(plan.options.target_file_size)}; "
        + (f"order: {plan.clustering.describe()}; " if plan.clustering else "")
        + f"skipped: {skipped}"
    )


def _print_quarantined(result: RunResult) -> None:
    """A line naming the unreadable files the run left out (each found one is also logged)."""
    for f in result.quarantined_files:
        line = f"  quarantined, left as it is: {f.path}: {f.reason}"
        out.print(line, markup=False, highlight=False)


def _print_result(result: RunResult) -> None:
    if result.stopped:
        out.print(f"{result.table}: stopped by signal; finished groups were committed")
    if result.recovered_files:
        out.print(
            f"{result.table}: removed {count(len(result.recovered_files), 'file')} of an abandoned run"
        )
    warn_in_doubt(result.table, result.commits_in_doubt)
    if result.snapshot_id is None:
        out.print(f"{result.table}: nothing compacted (no snapshot committed)")
        for failed in result.sorted_failures:
            out.print(
                f"  group {failed.group_id} {failed.kind}: {failed.reason}",
                markup=False,
                highlight=False,
            )
        _print_grown(result)
        _print_quarantined(result)
        return
    added_files, added_bytes = len(result.added_files), result.added_bytes
    avg = added_bytes / added_files if added_files else 0
    snapshots = ", ".join(str(i) for i in result.snapshot_ids)
    branch = result.plan.options.branch
    out.print(
        f"{result.table}: committed replace snapshot {snapshots}"
        + ("" if branch == DEFAULT_BRANCH else f" to branch {branch}")
        + ": "
        f"{count(len(result.rewritten_files), 'file')} ({format_size(result.rewritten_bytes)}) -> "
        f"{count(added_files, 'file')} ({format_size(added_bytes)}, avg {format_size(avg)}) "
        f"in {result.duration_ms / 1000:.1f}s"
    )
    for failed in result.sorted_failures:
        out.print(
            f"  group {failed.group_id} not committed ({failed.kind}): {failed.reason}",
            markup=False,
            highlight=False,
        )
    _print_grown(result)
    _print_quarantined(result)


def _print_grown(result: RunResult) -> None:
    """A line for each group left as it was because its rewrite would have grown it."""
    for grown in result.sorted_grown_groups:
        out.print(
            f"  group {grown.group_id} left as it was: its rewrite grew "
            f"{format_size(grown.input_bytes)} -> {format_size(grown.output_bytes)} "
            f"({grown.input_files} -> {count(grown.output_files, 'file')})",
            markup=False,
            highlight=False,
        )


@commands.command()
@with_model_flags(CompactOptions)
@guarded
def run(
    table: TableOpt,
    catalog: CatalogOpt = None,
    *,
    options: dict[str, Any],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; write and commit nothing.")
    ] = False,
    exit_code_if_busy: BusyExitOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Compact small files of one table into target-size files, as one `replace` snapshot.

    Example: compactor run --table db.events --target-file-size 256MB --where "region = 'eu'"

    Safe beside live writers: concurrent appends never conflict; a group whose input was
    changed meanwhile is left out. SIGTERM or Ctrl-C stops cleanly: no new group starts, running
    ones are abandoned, finished ones are committed, exit 0. If another compactor run holds the
    table, this one backs off and exits 0 (or --exit-code-if-busy). Exit 1 when a group failed.
    A file that is missing or not valid Parquet fails nothing: it is named and quarantined (see
    `compactor quarantine`), stays in the table as it is, and its group is compacted without it.
    """
    from compactor.api import compact, options_for
    from compactor.execute.progress_log import ProgressLog, progress_interval

    tbl = open_table(catalog, table)
    resolved = options_for(tbl, None, options)  # flags over the table's compactor.* properties
    _warn(resolved.warnings)
    bar = _Bar() if (not as_json and sys.stderr.isatty()) else None
    progress = bar or ProgressLog(table, _progress_line, progress_interval())
    try:
        with stop_on_signals() as stop:
            result = compact(tbl, resolved, dry_run=dry_run, progress=progress, stop=stop)
    finally:
        if bar:
            bar.stop()
    if as_json:
        print_json(result.to_dict())
    if result.backed_off:
        back_off(result.backed_off, as_json, exit_code_if_busy)
    if dry_run and not as_json:
        _print_plan(result.plan)
    elif not as_json:
        _print_result(result)
    if result.errors:
        first = result.errors[0]
        error = CompactorError(
            f"table {table}: {count(len(result.errors), 'group')} failed (committed groups stay "
            f"committed); group {first.group_id}: {first.reason}"
        )
        fail(error)  # with --json, the run's document (failed_groups) stays the only one


def _print_health(health: TableHealth) -> None:
    print_table(
        f"{health.table} (snapshot {health.snapshot_id}, {count(health.snapshots, 'snapshot')})",
        ("metric", "value"),
        [
            ("data files", str(health.data_files)),
            ("data bytes", format_size(health.data_bytes)),
            ("records", str(health.records)),
            ("average file size", format_size(health.average_file_size)),
            ("small files (a compaction would rewrite)", str(health.small_files)),
            (
                f"files under target (< 75% of {format_size(health.target_file_size)})",
                str(health.files_under_target),
            ),
            ("position delete files", str(health.position_delete_files)),
            ("equality delete files", str(health.equality_delete_files)),
            ("deletion vectors", str(health.deletion_vectors)),
            ("partitions", str(len(health.partitions))),
        ],
        right=("value",),
    )
    print_table(
        "partitions with the most files under target",
        ("partition", "files", "small", "under target", "bytes"),
        (
            (
                p.partition,
                str(p.data_files),
                str(p.small(health.min_input_files)[0]),
                str(p.files_under_target),
                format_size(p.data_bytes),
            )
            for p in health.worst_partitions()
        ),
        right=("files", "small", "under target", "bytes"),
        fold=("partition",),
        skip_empty=True,
    )


@commands.command()
@with_model_flags(CompactOptions, only=("target_file_size", "allow_small_target"))
@guarded
def inspect(
    table: TableOpt,
    catalog: CatalogOpt = None,
    *,
    options: dict[str, Any],
    as_json: JsonOpt = False,
) -> None:
    """Show a table's files: count, bytes, average size, small files, delete files, worst partitions.

    A file is under target below 75% of --target-file-size (the one `run` would use).
    """
    from compactor.api import inspect as inspect_table

    inspection = inspect_table(open_table(catalog, table), **options)
    _warn(inspection.warnings)
    if as_json:
        print_json(inspection.to_dict())
        return
    _print_health(inspection.health)
    stats = inspection.manifests
    if stats is not None:
        out.print(
            f"manifests: {stats.manifests['data']} data, {stats.manifests['deletes']} delete; "
            f"{stats.average_entries:,.1f} live entries per manifest; "
            f"{count(stats.metadata_files, 'metadata file')}"
        )
    for name, (value, source) in sorted(inspection.settings.items()):
        out.print(f"setting: {name} = {value} ({source})", markup=False, highlight=False)
    for action in inspection.paused:
        out.print(f"paused by the table's properties: {action}", markup=False, highlight=False)
    quarantined = {f.path for f in inspection.quarantined_files}
    for f in inspection.quarantined_files:
        line = (
            f"quarantined file, left out of compaction since {format_time(f.first_seen_ms)}: "
            f"{f.path}: {f.reason}"
        )
        out.print(line, markup=False, highlight=False)
    for path in inspection.unreadable_files:
        if path not in quarantined:
            line = f"unreadable file, skipped by the last compaction: {path}"
            out.print(line, markup=False, highlight=False)
    for c in inspection.commits_in_doubt:
        line = (
            f"commit in doubt: snapshot {c.commit.snapshot_id} of run {c.commit.run_id} on "
            f"{c.commit.branch} got no answer from the catalog and may still land; "
            f"{count(c.files_kept, 'file')} kept until it lands or can no longer land"
        )
        out.print(line, markup=False, highlight=False)
