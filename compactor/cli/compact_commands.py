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

from compactor.cli.common import CatalogOpt, JsonOpt, TableOpt, open_table, warn_in_doubt
from compactor.cli.output import err, fail, guarded, out, print_json, print_table
from compactor.durations import utc_now_text
from compactor.errors import CompactorError
from compactor.options import (
    DEFAULT_COMMIT_EVERY,
    DEFAULT_DELETE_FILE_THRESHOLD,
    DEFAULT_DELETE_RATIO_THRESHOLD,
    DEFAULT_EXECUTOR,
    DEFAULT_MAX_COMMITS,
    DEFAULT_MIN_INPUT_FILES,
    DEFAULT_REWRITE_JOB_ORDER,
    DEFAULT_STRATEGY,
    RewriteOptions,
    resolve_options,
)
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


def _warn(options: RewriteOptions) -> None:
    """Print each of the resolved options' warnings as one line on stderr."""
    for warning in options.warnings:
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
        return
    added_files, added_bytes = len(result.added_files), result.added_bytes
    avg = added_bytes / added_files if added_files else 0
    snapshots = ", ".join(str(i) for i in result.snapshot_ids)
    out.print(
        f"{result.table}: committed replace snapshot {snapshots}: "
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
@guarded
def run(
    table: TableOpt,
    catalog: CatalogOpt = None,
    target_file_size: Annotated[
        str | None,
        typer.Option(
            help="Output file size: 128MB, 512MiB or bytes, 64MB..512MiB. "
            "Default: the table's write.target-file-size-bytes, else 512MiB."
        ),
    ] = None,
    allow_small_target: Annotated[
        bool, typer.Option(help="Allow --target-file-size below 64MB (for tests and experiments).")
    ] = False,
    min_input_files: Annotated[
        int,
        typer.Option(
            help="Rewrite a group only with at least this many files (or a target's worth of bytes)."
        ),
    ] = DEFAULT_MIN_INPUT_FILES,
    delete_file_threshold: Annotated[
        int | None,
        typer.Option(
            help="Rewrite any data file with at least this many delete files (position or "
            "equality) applying to it, whatever its size. Default: off (as Spark)."
        ),
    ] = DEFAULT_DELETE_FILE_THRESHOLD,
    delete_ratio_threshold: Annotated[
        float,
        typer.Option(
            help="Rewrite any data file whose position deletes remove at least this share of "
            "its rows, whatever its size (as Spark's delete-ratio-threshold)."
        ),
    ] = DEFAULT_DELETE_RATIO_THRESHOLD,
    max_group_size: Annotated[
        str | None, typer.Option(help="Largest amount of input in one group (default 100GiB).")
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            help="Only touch files that may hold rows matching this filter, e.g. \"day >= '2026-01-01'\"."
        ),
    ] = None,
    parallelism: Annotated[
        int | None,
        typer.Option(
            help="Groups rewritten at once (default: one per core of this process; with "
            "--executor ray, as many as the cluster schedules). While fewer groups than this "
            "are planned, the largest one with two target files' worth of input or more is "
            "cut in two, in write order."
        ),
    ] = None,
    commit_every: Annotated[
        int,
        typer.Option(
            help="Partial progress: commit every N finished groups, so finished work survives "
            "a later failure and a failed group fails alone. 0 = one all-or-nothing commit."
        ),
    ] = DEFAULT_COMMIT_EVERY,
    max_commits: Annotated[
        int, typer.Option(help="With --commit-every: at most this many commits in one run.")
    ] = DEFAULT_MAX_COMMITS,
    executor: Annotated[
        str,
        typer.Option(
            help="Where groups are rewritten: 'threads' (in this process, --parallelism at once) "
            "or 'ray' (tasks on a Ray cluster; needs pip install 'compactor[ray]')."
        ),
    ] = DEFAULT_EXECUTOR,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="With --executor ray: the cluster to connect to (e.g. ray://head:10001 or "
            "auto). Default: Ray's own (RAY_ADDRESS, else a local Ray)."
        ),
    ] = None,
    memory_limit: Annotated[
        str | None,
        typer.Option(
            help="Resident memory this run aims to stay under, e.g. 1GiB (default 384MiB, at "
            "least 304MiB). It sets the buffers of each worker and, without --parallelism, how "
            "many run at once: one per 144MiB past 160MiB (two from 448MiB). With --executor "
            "ray: per Ray worker process."
        ),
    ] = None,
    bulk_read: Annotated[
        bool,
        typer.Option(
            help="Read files that need none of Iceberg's read rules (no deletes, the current "
            "schema's columns by id, name and type) many at once, in parallel. "
            "--no-bulk-read reads every file through the Iceberg read path (slower; to diagnose)."
        ),
    ] = True,
    min_file_size: Annotated[
        str | None,
        typer.Option(
            help="Files below this size are rewritten (Spark's min-file-size; default 75% of "
            "the target)."
        ),
    ] = None,
    max_file_size: Annotated[
        str | None,
        typer.Option(
            help="Files above this size are rewritten, split at the target (Spark's "
            "max-file-size; default 180% of the target)."
        ),
    ] = None,
    rewrite_all: Annotated[
        bool,
        typer.Option(
            "--rewrite-all",
            help="Rewrite every file (within --where), whatever its size, and every group, "
            "whatever --min-input-files says (Spark's rewrite-all).",
        ),
    ] = False,
    max_files_to_rewrite: Annotated[
        int | None,
        typer.Option(
            help="Rewrite only the groups, in --rewrite-job-order, that fit in this many input "
            "files together; the rest wait for the next run (Spark's max-files-to-rewrite)."
        ),
    ] = None,
    rewrite_job_order: Annotated[
        str,
        typer.Option(
            help="Order groups are rewritten and committed in: most-fragmented (most files "
            "first), bytes-asc, bytes-desc, files-asc, files-desc (Spark's rewrite-job-order)."
        ),
    ] = DEFAULT_REWRITE_JOB_ORDER,
    max_failed_commits: Annotated[
        int | None,
        typer.Option(
            help="With --commit-every: stop the run once more commits than this failed "
            "(default: --max-commits; Spark's partial-progress.max-failed-commits)."
        ),
    ] = None,
    strategy: Annotated[
        str,
        typer.Option(
            help="How each group's rows are ordered in the new files: binpack (as read), sort "
            "(by --sort-order, else the table's sort order) or zorder (by --zorder), Spark's "
            "strategies. Sorting happens per group, out of core in --memory-limit, spilling "
            "to $TMPDIR."
        ),
    ] = DEFAULT_STRATEGY,
    sort_order: Annotated[
        str | None,
        typer.Option(
            help="With --strategy sort: columns to sort by, in Spark's syntax, e.g. "
            '"event_time ASC NULLS LAST, region DESC" (default ASC; nulls first for ASC, '
            "last for DESC)."
        ),
    ] = None,
    zorder: Annotated[
        str | None,
        typer.Option(
            help="With --strategy zorder: the columns whose values are interleaved, e.g. "
            '"lat, lon" (two to four columns cluster best).'
        ),
    ] = None,
    branch: Annotated[
        str,
        typer.Option(
            help="Compact this branch of the table: plan from its head and commit the "
            "`replace` snapshot to it (Spark's branch option); other branches and main stay "
            "as they are."
        ),
    ] = "main",
    output_spec_id: Annotated[
        int | None,
        typer.Option(
            help="Rewrite the files of every other partition spec into this one (usually the "
            "current spec after a partitioning change), whatever their size, split by its "
            "partitions (Spark's output-spec-id). Default: each file keeps its spec."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; write and commit nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compact small files of one table into target-size files, as one `replace` snapshot.

    Example: compactor run --table db.events --target-file-size 256MB --where "region = 'eu'"

    Safe beside live writers: concurrent appends never conflict; a group whose input was
    changed meanwhile is left out. SIGTERM or Ctrl-C stops cleanly: no new group starts, running
    ones are abandoned, finished ones are committed, exit 0. If another compactor run holds the
    table, this one backs off and exits 0. Exit 1 when a group failed; a group with a file that
    is missing or not valid Parquet is skipped, the file named, and the others are committed.
    """
    from compactor.api import compact
    from compactor.execute.progress_log import ProgressLog, progress_interval

    tbl = open_table(catalog, table)
    options = resolve_options(
        table,
        tbl.metadata.properties,
        target_file_size=target_file_size,
        allow_small_target=allow_small_target,
        min_input_files=min_input_files,
        delete_file_threshold=delete_file_threshold,
        delete_ratio_threshold=delete_ratio_threshold,
        max_group_size=max_group_size,
        parallelism=parallelism,
        where=where,
        commit_every=commit_every,
        max_commits=max_commits,
        executor=executor,
        ray_address=ray_address,
        bulk_read=bulk_read,
        memory_limit=memory_limit,
        min_file_size=min_file_size,
        max_file_size=max_file_size,
        rewrite_all=rewrite_all,
        max_files_to_rewrite=max_files_to_rewrite,
        rewrite_job_order=rewrite_job_order,
        max_failed_commits=max_failed_commits,
        strategy=strategy,
        sort_order=sort_order,
        zorder=zorder,
        branch=branch,
        output_spec_id=output_spec_id,
    )
    _warn(options)
    bar = _Bar() if (not as_json and sys.stderr.isatty()) else None
    progress = bar or ProgressLog(table, _progress_line, progress_interval())
    try:
        with stop_on_signals() as stop:
            result = compact(tbl, options, dry_run=dry_run, progress=progress, stop=stop)
    finally:
        if bar:
            bar.stop()
    if result.backed_off and not as_json:
        err.print(result.backed_off, markup=False, highlight=False)
        return
    if as_json:
        print_json(result.to_dict())
    elif dry_run:
        _print_plan(result.plan)
    else:
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
@guarded
def inspect(
    table: TableOpt,
    catalog: CatalogOpt = None,
    target_file_size: Annotated[
        str | None,
        typer.Option(help="Size below 75% of which a file counts as small (default as for `run`)."),
    ] = None,
    allow_small_target: Annotated[bool, typer.Option(help="Allow a target below 64MB.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show a table's files: count, bytes, average size, small files, delete files, worst partitions."""
    from compactor.commit.inflight import in_doubt_report
    from compactor.compaction import last_unreadable_files
    from compactor.planning.health import table_health

    tbl = open_table(catalog, table)
    options = resolve_options(
        table,
        tbl.metadata.properties,
        target_file_size=target_file_size,
        allow_small_target=allow_small_target,
    )
    _warn(options)
    health = table_health(tbl, table, options.target_file_size, options.min_input_files)
    unreadable = last_unreadable_files(tbl)
    in_doubt = in_doubt_report(tbl)
    if as_json:
        print_json(
            {**health.to_dict(), "unreadable_files": unreadable, "commits_in_doubt": in_doubt}
        )
        return
    _print_health(health)
    for path in unreadable:
        line = f"unreadable file, skipped by the last compaction: {path}"
        out.print(line, markup=False, highlight=False)
    for c in in_doubt:
        line = (
            f"commit in doubt: snapshot {c['snapshot_id']} of run {c['run_id']} on "
            f"{c['branch']} got no answer from the catalog and may still land; "
            f"{count(c['files_kept'], 'file')} kept until it lands or can no longer land"
        )
        out.print(line, markup=False, highlight=False)
