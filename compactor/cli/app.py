"""The ``compactor`` command line."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table as RichTable
from rich.text import Text

from compactor import __version__
from compactor.cli.bench import bench_app
from compactor.cli.output import err, fail, guarded, out, state
from compactor.durations import utc_now_text
from compactor.errors import EXIT_USAGE, CompactorError, ConfigError, UsageError
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
from compactor.redaction import protect, redact
from compactor.sizes import count, format_size

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from compactor.compaction import RunResult
    from compactor.daemon.config import DaemonConfig
    from compactor.daemon.jobfiles import Job
    from compactor.planning.health import TableHealth
    from compactor.planning.planner import Plan

# pyiceberg, and every module built on it, is imported inside the commands, after
# check_pyiceberg_config(): pyiceberg reads ~/.pyiceberg.yaml on import, and a broken file must
# fail as one error line, not a traceback. --help and --version stay quick too.

app = typer.Typer(
    help="Keep Apache Iceberg tables fast: compact small files into large ones.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(bench_app, name="bench")

CatalogOpt = Annotated[
    str | None,
    typer.Option(
        "--catalog",
        "-c",
        help="Catalog name from ~/.pyiceberg.yaml or PYICEBERG_CATALOG__<NAME>__* variables. "
        "Default: pyiceberg's default catalog if configured, else the embedded SQLite catalog "
        "in $COMPACTOR_HOME (~/.local/share/compactor).",
    ),
]
TableOpt = Annotated[
    str, typer.Option("--table", "-t", help="Table to work on, as NAMESPACE.TABLE.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]


def _open(catalog: str | None, table: str) -> tuple[Catalog, Table]:
    """The catalog and the table; an unreachable catalog's error names the table too."""
    from compactor.errors import CatalogUnreachableError
    from compactor.iceberg.catalogs import open_catalog, open_table

    try:
        opened = open_catalog(catalog)
    except CatalogUnreachableError as exc:
        raise CatalogUnreachableError(f"table {table}: {exc}") from exc
    return opened, open_table(opened, table)


def _open_table(catalog: str | None, table: str) -> Table:
    return _open(catalog, table)[1]


def _print_version(value: bool) -> None:
    if value:
        out.print(f"compactor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show debug logs and full tracebacks.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,  # before click asks for the missing command
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    state["verbose"] = verbose
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        protect(handler)


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


def _print_plan(plan: Plan) -> None:
    table = RichTable(title=f"plan for {plan.table} (snapshot {plan.snapshot_id})")
    for column in (
        "group",
        "partition",
        "input files",
        "input bytes",
        "deletes",
        "expected outputs",
    ):
        if column == "partition":
            table.add_column(column, overflow="fold")
        else:
            table.add_column(column, justify="right")
    for g in plan.groups:
        s = g.summary()
        table.add_row(
            str(s["group_id"]),
            s["partition"],
            str(s["input_files"]),
            format_size(s["input_bytes"]),
            str(s["delete_files"]),
            str(s["expected_output_files"]),
        )
    if plan.groups:
        out.print(table)
    skipped = ", ".join(f"{k}={v}" for k, v in sorted(plan.skipped.items())) or "none"
    out.print(
        f"{count(plan.input_files, 'file')} ({format_size(plan.input_bytes)}) in {count(len(plan.groups), 'group')} "
        f"from {plan.data_files_scanned} data files scanned; target {format_size(plan.options.target_file_size)}; "
        + (f"order: {plan.clustering.describe()}; " if plan.clustering else "")
        + f"skipped: {skipped}"
    )


def _print_result(result: RunResult) -> None:
    data = result.to_dict()
    if result.stopped:
        out.print(f"{result.table}: stopped by signal; finished groups were committed")
    if data["recovered_files"]:
        out.print(
            f"{result.table}: removed {count(data['recovered_files'], 'file')} of an abandoned run"
        )
    _warn_in_doubt(result.table, data["commits_in_doubt"])
    if data["snapshot_id"] is None:
        out.print(f"{result.table}: nothing compacted (no snapshot committed)")
        for failed in data["failed_groups"]:
            out.print(
                f"  group {failed['group_id']} {failed['kind']}: {failed['reason']}",
                markup=False,
                highlight=False,
            )
        _print_grown(data)
        return
    avg = data["added_bytes"] / data["added_files"] if data["added_files"] else 0
    snapshots = ", ".join(str(i) for i in data["snapshot_ids"])
    out.print(
        f"{result.table}: committed replace snapshot {snapshots}: "
        f"{count(data['rewritten_files'], 'file')} ({format_size(data['rewritten_bytes'])}) -> "
        f"{count(data['added_files'], 'file')} ({format_size(data['added_bytes'])}, avg {format_size(avg)}) "
        f"in {data['duration_ms'] / 1000:.1f}s"
    )
    for failed in data["failed_groups"]:
        out.print(
            f"  group {failed['group_id']} not committed ({failed['kind']}): {failed['reason']}",
            markup=False,
            highlight=False,
        )
    _print_grown(data)


def _warn_in_doubt(table: str, commits: list[dict[str, Any]]) -> None:
    """One warning line per commit of an earlier run that may still land (its files are kept)."""
    for c in commits:
        err.print(
            f"warning: {table}: kept the files of run {c['run_id']}: its commit of snapshot "
            f"{c['snapshot_id']} on {c['branch']} got no answer and may still land; a later run "
            "removes them once it has landed or can no longer land",
            markup=False,
            highlight=False,
        )


def _print_grown(data: dict[str, Any]) -> None:
    """A line for each group left as it was because its rewrite would have grown it."""
    for grown in data["grown_groups"]:
        out.print(
            f"  group {grown['group_id']} left as it was: its rewrite grew "
            f"{format_size(grown['input_bytes'])} -> {format_size(grown['output_bytes'])} "
            f"({grown['input_files']} -> {count(grown['output_files'], 'file')})",
            markup=False,
            highlight=False,
        )


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


@app.command()
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

    def go() -> None:
        from compactor.api import compact
        from compactor.execute.progress_log import ProgressLog, progress_interval

        tbl = _open_table(catalog, table)
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
            print(json.dumps(result.to_dict(), indent=2))
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

    guarded(go, as_json=as_json)


def _print_health(health: TableHealth) -> None:
    data = health.to_dict()
    table = RichTable(
        title=f"{health.table} (snapshot {health.snapshot_id}, {count(health.snapshots, 'snapshot')})"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("data files", str(health.data_files))
    table.add_row("data bytes", format_size(health.data_bytes))
    table.add_row("records", str(health.records))
    table.add_row("average file size", format_size(health.average_file_size))
    table.add_row("small files (a compaction would rewrite)", str(health.small_files))
    table.add_row(
        f"files under target (< 75% of {format_size(health.target_file_size)})",
        str(health.files_under_target),
    )
    table.add_row("position delete files", str(health.position_delete_files))
    table.add_row("equality delete files", str(health.equality_delete_files))
    table.add_row("deletion vectors", str(health.deletion_vectors))
    table.add_row("partitions", str(len(health.partitions)))
    out.print(table)
    if data["worst_partitions"]:
        parts = RichTable(title="partitions with the most files under target")
        for column in ("partition", "files", "small", "under target", "bytes"):
            if column == "partition":
                parts.add_column(column, overflow="fold")
            else:
                parts.add_column(column, justify="right")
        for p in data["worst_partitions"]:
            parts.add_row(
                p["partition"],
                str(p["data_files"]),
                str(p["small_files"]),
                str(p["files_under_target"]),
                format_size(p["data_bytes"]),
            )
        out.print(parts)


def _warn(options: RewriteOptions) -> None:
    """Print each of the resolved options' warnings as one line on stderr."""
    for warning in options.warnings:
        err.print(f"warning: {warning}", markup=False, highlight=False)


@app.command()
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

    def go() -> None:
        from compactor.commit.inflight import in_doubt_report
        from compactor.compaction import last_unreadable_files
        from compactor.planning.health import table_health

        tbl = _open_table(catalog, table)
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
            document = {
                **health.to_dict(),
                "unreadable_files": unreadable,
                "commits_in_doubt": in_doubt,
            }
            print(json.dumps(document, indent=2))
        else:
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

    guarded(go, as_json=as_json)


def _report_deletions(title: str, data: dict[str, Any], dry_run: bool) -> None:
    """Print what was (or would be) deleted by kind; fail when some files could not be."""
    verb = "would delete" if dry_run else "deleted"
    kinds = data["would_delete" if dry_run else "deleted"]
    files, size = (
        (data["would_delete_files"], data["would_delete_bytes"])
        if dry_run
        else (data["files_deleted"], data["bytes_deleted"])
    )
    table = RichTable(title=title)
    for column in ("kind", "files", "bytes"):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for kind, counts in kinds.items():
        table.add_row(kind.replace("_", " "), str(counts["files"]), format_size(counts["bytes"]))
    if kinds:
        out.print(table)
    out.print(
        f"{data['table']}: {verb} {count(files, 'file')} ({format_size(size)})"
        + (
            f"; refused {data['refused_outside_table_location']} outside the table location"
            if data["refused_outside_table_location"]
            else ""
        )
        + (
            f"; refused {data['refused_other_table_locations']} under other tables' locations"
            if data["refused_other_table_locations"]
            else ""
        )
        + (f"; {len(data['failed'])} could not be deleted" if data["failed"] else "")
    )


def _fail_on_undeleted(data: dict[str, Any]) -> None:
    """Exit 1 when files could not be deleted; with --json, the command's document stays the
    only one on stdout."""
    if data["failed"]:
        fail(
            CompactorError(
                f"table {data['table']}: could not delete {data['failed'][0]} and others"
            )
        )


def _snapshot_ids(text: str | None) -> list[int]:
    """``--snapshot-ids 1,2,3`` as ids; anything else is a UsageError naming the value."""
    if text is None:
        return []
    ids = []
    for part in text.split(","):
        try:
            ids.append(int(part.strip()))
        except ValueError:
            raise UsageError(
                f"snapshot_ids: {part.strip()!r} is not a snapshot id", "snapshot_ids"
            ) from None
    return ids


@app.command()
def expire(
    table: TableOpt,
    catalog: CatalogOpt = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            help="Expire snapshots older than this: a duration (12h, 5d, 2w) or an ISO timestamp. "
            "Default: the table's history.expire.max-snapshot-age-ms, else 5d."
        ),
    ] = None,
    retain_last: Annotated[
        int | None,
        typer.Option(
            help="Keep at least this many snapshots of each branch. "
            "Default: the table's history.expire.min-snapshots-to-keep, else 1."
        ),
    ] = None,
    snapshot_ids: Annotated[
        str | None,
        typer.Option(
            help="Also expire these snapshots, comma-separated, whatever their age or rank "
            "(Spark's snapshot_ids); never the head of a branch or tag."
        ),
    ] = None,
    clean_expired_metadata: Annotated[
        bool,
        typer.Option(
            "--clean-expired-metadata",
            help="Also remove the partition specs and schemas no retained snapshot uses "
            "(Spark's clean_expired_metadata); never the default spec or current schema.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show what would be expired and deleted; change nothing."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Expire old snapshots, then delete the files only expired snapshots could reach.

    Branches and tags keep their snapshots (and their own retention properties); the current
    snapshot is never expired; nothing outside the table's location, or under another table's
    location, is deleted. Old metadata.json files go too when
    write.metadata.delete-after-commit.enabled is true. Tables with gc.enabled=false, or sharing
    their location with another table of the catalog, are refused (exit 2).

    Example: compactor expire --table db.events --older-than 2d --retain-last 10 --dry-run
    """

    def go() -> None:

        from compactor.api import expire_snapshots

        cat, tbl = _open(catalog, table)
        data = expire_snapshots(
            tbl,
            older_than=older_than,
            retain_last=retain_last,
            dry_run=dry_run,
            catalog=cat,
            snapshot_ids=_snapshot_ids(snapshot_ids),
            clean_expired_metadata=clean_expired_metadata,
        ).to_dict()
        if as_json:
            print(json.dumps(data, indent=2))
        else:
            verb = "would expire" if dry_run else "expired"
            out.print(
                f"{table}: {verb} {count(data['snapshots_expired'], 'snapshot')}, kept {data['snapshots_retained']}"
                + (
                    f"; removed refs {', '.join(data['refs_removed'])}"
                    if data["refs_removed"]
                    else ""
                )
            )
            _report_deletions(f"files only expired snapshots reached ({table})", data, dry_run)
        _fail_on_undeleted(data)

    guarded(go, as_json=as_json)


@app.command()
def orphans(
    table: TableOpt,
    catalog: CatalogOpt = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            help="Only delete files older than this (a duration or an ISO timestamp), so files "
            "of commits in flight are safe. Default: 3d; at least 1d unless "
            "--allow-short-older-than."
        ),
    ] = None,
    allow_short_older_than: Annotated[
        bool,
        typer.Option(
            help="Allow --older-than below 1d (for tests and experiments): files of commits and "
            "compaction runs in flight could be deleted."
        ),
    ] = False,
    location: Annotated[
        str | None,
        typer.Option(
            help="Sweep only this sub-path of the table's location, in full or relative to it, "
            "e.g. data/region=eu (Spark's location)."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the orphan files; delete nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete files under the table's location that no metadata of the table references.

    Symlinks, odd locations, anything outside the table's location or under another table's
    location, and every file a compaction run record lists are kept. Tables with
    gc.enabled=false, at the warehouse root or sharing their location with another table of
    the catalog are refused (exit 2).

    Example: compactor orphans --table db.events --dry-run
    """

    def go() -> None:

        from compactor.api import remove_orphans

        cat, tbl = _open(catalog, table)
        result = remove_orphans(
            tbl,
            older_than=older_than,
            allow_short_older_than=allow_short_older_than,
            dry_run=dry_run,
            catalog=cat,
            location=location,
        )
        data = result.to_dict()
        if as_json:
            print(json.dumps(data, indent=2))
        else:
            others = sum(data["skipped_other_tables"].values())
            out.print(
                f"{table}: listed {count(data['listed_files'], 'file')}; {count(data['orphan_files'], 'orphan')}; "
                f"{data['skipped_too_young']} unreferenced but too young; "
                f"{data['skipped_in_run_record']} kept for a compaction run record; "
                f"{others} under other tables' locations; {len(data['refused'])} refused"
            )
            for path in data["orphans"]:
                out.print(f"  {path}", markup=False, highlight=False)
            _report_deletions(f"orphan files ({table})", data, dry_run)
        _fail_on_undeleted(data)

    guarded(go, as_json=as_json)


@app.command("rewrite-deletes")
def rewrite_deletes(
    table: TableOpt,
    catalog: CatalogOpt = None,
    target_file_size: Annotated[
        str | None,
        typer.Option(
            help="Size at which a new delete file rolls over. Default: the table's "
            "write.delete.target-file-size-bytes, else 64MiB."
        ),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(help="Only partitions this row filter can match, e.g. \"region = 'eu'\"."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Read the delete files and report; write nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compact position-delete files per partition and drop the ones that apply to nothing.

    Iceberg Java's rewrite_position_delete_files with remove-dangling-deletes: each partition's
    position-delete files become one file (rolling at --target-file-size), without the rows
    whose data file is no longer live; a delete file that applies to no live data file is
    removed. Deleted rows stay deleted; data files are not touched. One `replace` snapshot;
    partitions changed by a concurrent commit are left out. Format-3 tables (deletion vectors)
    are refused. `compactor run` applies deletes while rewriting data files; this is for the
    delete files of data files that are not rewritten.

    Example: compactor rewrite-deletes --table db.orders --dry-run
    """

    def go() -> None:
        from compactor.api import rewrite_deletes

        tbl = _open_table(catalog, table)
        data = rewrite_deletes(
            tbl, target_file_size=target_file_size, where=where, dry_run=dry_run
        ).to_dict()
        if as_json:
            print(json.dumps(data, indent=2))
            return
        _warn_in_doubt(table, data["commits_in_doubt"])
        verb = "would replace" if dry_run else "replaced"
        out.print(
            f"{table}: {verb} {data['files_removed']} position delete files with "
            f"{data['files_added']}; dropped {data['dangling_rows_dropped']} rows that applied to "
            "no live data file"
        )
        kinds = RichTable(title=f"delete files ({table})")
        for column in ("kind", "before", "after"):
            kinds.add_column(column, justify="left" if column == "kind" else "right")
        for kind, before in data["delete_files_before"].items():
            after = data["delete_files_after"].get(kind, 0)
            kinds.add_row(kind.replace("_", " "), str(before), str(after))
        out.print(kinds)
        for conflict in data["conflicts"]:
            out.print(f"partition group {conflict['group_id']} left out: {conflict['reason']}")

    guarded(go, as_json=as_json)


@app.command()
def demo(
    commits: Annotated[
        int, typer.Option(help="Small commits to write into the sample table.")
    ] = 200,
    rows_per_commit: Annotated[int, typer.Option(help="Rows in each commit.")] = 2500,
) -> None:
    """Build a fragmented sample table (demo.events) in the embedded catalog, compact it, show the gain.

    Uses $COMPACTOR_HOME (default ~/.local/share/compactor); `make demo` points it at .compactor-demo/.
    """

    def on_error(message: str) -> None:
        raise CompactorError(message)

    def go() -> None:
        from compactor.cli.demo import run_demo

        run_demo(out, commits=commits, rows_per_commit=rows_per_commit, on_error=on_error)

    guarded(go)


ConfigFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="The daemon's settings file. Default: ./compactor.toml if it exists, else defaults "
        "(job files in ./jobs, state in $COMPACTOR_HOME/daemon.db).",
    ),
]


def _load_daemon_setup(config: Path | None) -> tuple[DaemonConfig, list[Job]]:
    from compactor.daemon.config import load_daemon_config
    from compactor.daemon.jobfiles import load_jobs

    settings = load_daemon_config(config)
    jobs = load_jobs(settings.jobs_dir)
    _check_catalogs(jobs, settings.section.catalog)
    return settings, jobs


def _check_catalogs(jobs: list[Job], default: str | None) -> None:
    """Every job's catalog is configured (checked offline: no catalog is contacted)."""
    from compactor.iceberg.catalogs import catalog_properties

    for job in jobs:
        try:
            catalog_properties(job.spec.catalog or default)
        except ConfigError as exc:
            raise ConfigError(f"{job.path}: {exc}") from None


@app.command()
def daemon(config: ConfigFileOpt = None) -> None:
    """Run continuously: compact, expire and sweep the tables of the job files on their schedules.

    Serves /metrics (Prometheus) and /healthz on 127.0.0.1:9464 unless `listen` says otherwise,
    logs one JSON object a line when stderr is not a terminal, and keeps its run history in the
    state file that `compactor status` reads. SIGTERM or Ctrl-C drains: no new run starts,
    running ones commit their finished groups, and the process exits 0.

    Example: compactor daemon --config /etc/compactor/compactor.toml
    """

    def go() -> None:
        from compactor.daemon.logs import configure_logging
        from compactor.daemon.service import Daemon

        settings, jobs = _load_daemon_setup(config)
        configure_logging(settings.section.log_format, state["verbose"])
        service = Daemon(settings, jobs)
        # Signals wait in the main thread (sigwait), blocked everywhere else: a signal the
        # kernel would hand to a worker thread can then never go unnoticed.
        signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            service.start()
        except OSError as exc:
            raise CompactorError(f"daemon: {exc}") from exc
        received = signal.sigwait(signals)
        logging.getLogger("compactor.daemon.service").info(
            "signal received", extra={"event": "signal", "signal": signal.Signals(received).name}
        )
        service.drain()

    guarded(go)


jobs_app = typer.Typer(help="Inspect and check the daemon's job files.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("validate")
def jobs_validate(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Job files (or directories of them) to check. Default: every *.toml of the "
            "daemon's job directory."
        ),
    ] = None,
    config: ConfigFileOpt = None,
    connect: Annotated[
        bool,
        typer.Option(
            "--connect",
            help="Also load every catalog the job files name and resolve each job's tables: "
            "an unreachable catalog, a named table that does not exist and a glob that matches "
            "no table are errors (one line each).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check job files without starting the daemon; the first problem is reported as FILE:LINE.

    Offline by default: no catalog is contacted. With --connect, each job's tables are resolved
    in its catalog and listed.

    Example: compactor jobs validate jobs/*.toml

    Example: compactor jobs validate --connect --config /etc/compactor/compactor.toml
    """

    def go() -> None:
        from compactor.daemon.jobfiles import load_job, resolve_jobs

        paths = [
            found
            for path in files or []
            for found in (sorted(path.glob("*.toml")) if path.is_dir() else [path])
        ]
        default_catalog = None
        if files:
            jobs = [load_job(path) for path in paths]
            _check_catalogs(jobs, None)
        else:
            settings, jobs = _load_daemon_setup(config)
            default_catalog = settings.section.catalog
        summary: list[dict[str, Any]] = [  # the --json document's jobs
            {
                "file": str(job.path),
                "description": job.spec.description,
                "catalog": job.spec.catalog,
                "tables": job.spec.tables,
                "exclude": job.spec.exclude,
                "actions": {name: s.describe() for name, s in job.spec.actions().items()},
            }
            for job in jobs
        ]
        resolved = resolve_jobs(jobs, default_catalog) if connect else []
        for job in summary:
            job["resolved"] = None  # without --connect
        for job, resolution in zip(summary, resolved, strict=False):
            job["resolved"] = {"catalog": resolution.catalog, "tables": resolution.tables}
        problems = [redact(problem) for r in resolved for problem in r.problems]
        if as_json:
            document = {
                "valid": not problems,
                "jobs": summary,
                "errors": problems,
                "exit_code": EXIT_USAGE if problems else 0,
            }
            print(json.dumps(document, indent=2))
        else:
            failed = {str(r.job.path) for r in resolved if r.problems}
            for job in summary:
                if job["file"] in failed:
                    continue
                actions = "; ".join(f"{name} {when}" for name, when in job["actions"].items())
                excluded = f" except {', '.join(job['exclude'])}" if job["exclude"] else ""
                lines = [f"{job['file']}: ok: {', '.join(job['tables'])}{excluded}: {actions}"]
                if job["resolved"] is not None:
                    tables = job["resolved"]["tables"]
                    lines.append(
                        f"{job['file']}: {count(len(tables), 'table')} ({', '.join(tables)})"
                    )
                for line in lines:
                    out.print(line, markup=False, highlight=False)
        for problem in problems:
            err.print(f"error: {problem}", markup=False, highlight=False)
        if problems:
            raise typer.Exit(EXIT_USAGE)

    guarded(go, as_json=as_json)


def _when(at_ms: int | None) -> str:
    from compactor.durations import format_time

    return format_time(at_ms) if at_ms else "-"


@app.command()
def status(config: ConfigFileOpt = None, as_json: JsonOpt = False) -> None:
    """Show what the daemon knows: per-table fragmentation, each job's last tick (failures in a
    row, last success, last error), last runs, next planned runs.

    Reads the daemon's state file, so it works while the daemon runs (or after it stopped).
    """

    def go() -> None:
        import time

        from compactor.daemon.config import load_daemon_config
        from compactor.daemon.jobfiles import load_jobs
        from compactor.daemon.status import daemon_status

        settings = load_daemon_config(config)
        if not settings.state_path.exists():
            raise ConfigError(
                f"state file {settings.state_path}: does not exist (has the daemon run with this "
                "--config?)"
            )
        jobs = load_jobs(settings.jobs_dir) if settings.jobs_dir.is_dir() else []
        data = daemon_status(settings, jobs, time.time())
        if as_json:
            print(json.dumps(data, indent=2))
            return
        tables = RichTable(title=f"tables ({data['state_file']})")
        for column in (
            "table",
            "job",
            "small files",
            "delete files",
            "data files",
            "score",
            "due",
            "last compaction",
            "next compaction",
        ):
            tables.add_column(column, justify="left" if column in ("table", "job") else "right")
        for t in data["tables"]:
            last = t["last_compaction"]
            tables.add_row(
                t["table"],
                t["job"],
                "-" if t["small_files"] is None else str(t["small_files"]),
                str(t["delete_files"]),
                str(t["data_files"]),
                str(t["score"]),
                "yes" if t["due"] else "no",
                f"{last['outcome']} {_when(last['ended_at_ms'])}" if last else "-",
                _when(t["next_compaction_at_ms"]),
            )
        out.print(tables)
        ticks = RichTable(title="jobs")
        for column in (
            "job",
            "action",
            "last tick",
            "outcome",
            "failed in a row",
            "last success",
            "last error",
        ):
            ticks.add_column(column, justify="right" if column == "failed in a row" else "left")
        for j in data["jobs"]:
            ticks.add_row(
                j["job"],
                j["action"],
                _when(j["last_tick_at_ms"]),
                j["last_outcome"],
                str(j["consecutive_failures"]),
                _when(j["last_success_at_ms"]),
                Text(j["last_error"] or ""),  # as written: no markup
            )
        out.print(ticks)
        schedules = RichTable(title="next ticks")
        for column in ("job", "action", "next run"):
            schedules.add_column(column)
        for s in data["schedules"]:
            schedules.add_row(s["job"], s["action"], _when(s["next_run_at_ms"]))
        out.print(schedules)
        runs = RichTable(title="recent runs")
        for column in (
            "started",
            "table",
            "action",
            "outcome",
            "files in",
            "bytes in",
            "files out",
            "error",
        ):
            runs.add_column(
                column, justify="right" if column.startswith(("files", "bytes")) else "left"
            )
        for r in data["runs"]:
            runs.add_row(
                _when(r["started_at_ms"]),
                r["table_name"],
                r["action"],
                r["outcome"] or "running",
                str(r["input_files"]),
                format_size(r["input_bytes"]),
                str(r["output_files"]),
                Text(r["error"] or ""),  # as written: no markup
            )
        out.print(runs)
        unreadable = RichTable(title="unreadable files (skipped by each table's last compaction)")
        for column in ("table", "file", "reason"):
            unreadable.add_column(column, overflow="fold")
        for t in data["tables"]:
            for f in (t["last_compaction"] or {}).get("skipped_files", []):
                unreadable.add_row(t["table"], Text(f["path"]), Text(f["reason"]))  # no markup
        if unreadable.row_count:
            out.print(unreadable)
        in_doubt = RichTable(title="commits in doubt (their files kept until each lands or cannot)")
        for column in ("table", "run", "snapshot", "branch"):
            in_doubt.add_column(column)
        newest = {r["table_name"]: r for r in reversed(data["runs"]) if r["outcome"]}
        for name, run in sorted(newest.items()):  # as each table's newest run left them
            for c in run["commits_in_doubt"]:
                in_doubt.add_row(name, c["run_id"], str(c["snapshot_id"]), c["branch"])
        if in_doubt.row_count:
            out.print(in_doubt)

    guarded(go, as_json=as_json)


VERBOSE_FLAGS = ("--verbose", "-v")


def main() -> None:
    """Console-script entry point: ``--verbose`` (``-v``) is taken after the command too."""
    args = sys.argv[1:]
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in VERBOSE_FLAGS][:1]
    rest = [a for a in args[:end] if a not in VERBOSE_FLAGS] + args[end:]
    app(args=flags + rest)
