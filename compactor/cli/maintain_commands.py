"""``compactor expire``, ``orphans``, ``rewrite-deletes`` and ``rewrite-manifests``: keep a
table's files in order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from compactor.cli.common import (
    BusyExitOpt,
    CatalogOpt,
    JsonOpt,
    TableOpt,
    back_off,
    open_catalog_and_table,
    open_table,
    warn_in_doubt,
)
from compactor.cli.model_flags import with_model_flags
from compactor.cli.output import err, fail, guarded, out, print_json, print_table
from compactor.errors import CompactorError, UsageError
from compactor.options.defaults import DEFAULT_BRANCH
from compactor.options.maintenance import (
    ExpireOptions,
    OrphansOptions,
    RewriteDeletesOptions,
    RewriteManifestsOptions,
)
from compactor.sizes import count, format_size

if TYPE_CHECKING:
    from compactor.maintain.expire import DeletionReport

commands = typer.Typer()

# How many orphan paths the text output of `orphans` prints without --list.
ORPHANS_SHOWN = 20


def _report_deletions(title: str, table: str, report: DeletionReport) -> None:
    """Print what was (or would be) deleted, by kind."""
    verb = "would delete" if report.dry_run else "deleted"
    counts = report.counts
    files = sum(n for n, _ in counts.values())
    size = sum(b for _, b in counts.values())
    print_table(
        title,
        ("kind", "files", "bytes"),
        ((kind.replace("_", " "), str(n), format_size(b)) for kind, (n, b) in counts.items()),
        right=("files", "bytes"),
        skip_empty=True,
    )
    out.print(
        f"{table}: {verb} {count(files, 'file')} ({format_size(size)})"
        + (
            f"; refused {len(report.outside_location)} outside the table location"
            if report.outside_location
            else ""
        )
        + (
            f"; refused {len(report.other_tables)} under other tables' locations"
            if report.other_tables
            else ""
        )
        + (f"; {len(report.failed)} could not be deleted" if report.failed else "")
    )


def _fail_on_undeleted(table: str, report: DeletionReport) -> None:
    """Exit 1 when files could not be deleted; with --json, the command's document stays the
    only one on stdout."""
    if report.failed:
        fail(CompactorError(f"table {table}: could not delete {report.failed[0]} and others"))


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


@commands.command()
@with_model_flags(ExpireOptions)
@guarded
def expire(
    table: TableOpt,
    catalog: CatalogOpt = None,
    *,
    options: dict[str, Any],
    snapshot_ids: Annotated[
        str | None,
        typer.Option(
            help="Also expire these snapshots, comma-separated, whatever their age or rank "
            "(Spark's snapshot_ids); never the head of a branch or tag."
        ),
    ] = None,
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
    from compactor.api import expire_snapshots

    cat, tbl = open_catalog_and_table(catalog, table)
    result = expire_snapshots(
        tbl, dry_run=dry_run, catalog=cat, snapshot_ids=_snapshot_ids(snapshot_ids), **options
    )
    if as_json:
        print_json(result.to_dict())
    else:
        verb = "would expire" if dry_run else "expired"
        refs = result.plan.remove_refs
        out.print(
            f"{table}: {verb} {count(len(result.plan.expire), 'snapshot')}, kept {len(result.plan.retain)}"
            + (f"; removed refs {', '.join(refs)}" if refs else "")
        )
        _report_deletions(
            f"files only expired snapshots reached ({table})", result.table, result.report
        )
    _fail_on_undeleted(result.table, result.report)


@commands.command()
@with_model_flags(OrphansOptions)
@guarded
def orphans(
    table: TableOpt,
    catalog: CatalogOpt = None,
    *,
    options: dict[str, Any],
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
    list_all: Annotated[
        bool,
        typer.Option(
            "--list",
            help=f"Print every orphan's path, not only the first {ORPHANS_SHOWN} (text output).",
        ),
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
    from compactor.api import remove_orphans

    cat, tbl = open_catalog_and_table(catalog, table)
    result = remove_orphans(tbl, dry_run=dry_run, catalog=cat, location=location, **options)
    if as_json:
        print_json(result.to_dict())
    else:
        scan = result.scan
        out.print(
            f"{table}: listed {count(scan.listed, 'file')}; {count(len(scan.orphans), 'orphan')}; "
            f"{scan.too_young} unreferenced but too young; "
            f"{scan.in_run_record} kept for a compaction run record; "
            f"{sum(scan.other_tables.values())} under other tables' locations; "
            f"{len(scan.refused)} refused"
        )
        paths = result.orphan_locations
        shown = paths if list_all else paths[:ORPHANS_SHOWN]
        for path in shown:
            out.print(f"  {path}", markup=False, highlight=False)
        if len(shown) < len(paths):
            out.print(f"  ... and {len(paths) - len(shown)} more (--list prints them all)")
        _report_deletions(f"orphan files ({table})", result.table, result.report)
    _fail_on_undeleted(result.table, result.report)


@commands.command("rewrite-deletes")
@with_model_flags(RewriteDeletesOptions)
@guarded
def rewrite_deletes(
    table: TableOpt,
    catalog: CatalogOpt = None,
    *,
    options: dict[str, Any],
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Plan the conversion, read the position delete files, and report; write nothing.",
        ),
    ] = False,
    exit_code_if_busy: BusyExitOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Convert equality deletes into position deletes, then compact position-delete files per
    partition and drop the ones that apply to nothing.

    First each equality delete file's rows are found in the data files it applies to, reading
    only their key columns, and written as position deletes of their partition: one `replace`
    snapshot adds those and removes the equality delete files (--no-convert-equality-deletes
    skips this). Then, as Iceberg Java's rewrite_position_delete_files with
    remove-dangling-deletes, each partition's position-delete files become one file (rolling at
    --target-file-size), without the rows whose data file is no longer live; a delete file that
    applies to no live data file is removed (a second `replace` snapshot). Deleted rows stay
    deleted; no data file is written; partitions changed by a concurrent commit are left out.
    On format-3 tables equality deletes become deletion vectors (merged with each data file's
    earlier deletes), which are not compacted: a format-3 table without equality deletes is
    refused. `compactor run` applies deletes while rewriting data files; this is for the
    delete files of data files that are not rewritten.

    Example: compactor rewrite-deletes --table db.orders --dry-run
    """
    from compactor.api import rewrite_deletes as rewrite

    tbl = open_table(catalog, table)
    result = rewrite(tbl, dry_run=dry_run, **options)
    if as_json:
        print_json(result.to_dict())
    if result.backed_off:
        back_off(result.backed_off, as_json, exit_code_if_busy)
    if as_json:
        return
    warn_in_doubt(table, result.commits_in_doubt)
    branch = options.get("branch") or DEFAULT_BRANCH
    where = table if branch == DEFAULT_BRANCH else f"{table} (branch {branch})"
    conversion = result.equality_conversion
    if conversion is not None and (conversion.plan.equality_deletes or conversion.skipped):
        written = conversion.position_delete_files_written
        out.print(
            f"{where}: {'would convert' if dry_run else 'converted'} "
            f"{conversion.equality_delete_files_converted} equality delete files"
            + ("" if written is None else f" into {written} position delete files")
            + (
                f" and {conversion.deletion_vectors_written} deletion vectors"
                if conversion.deletion_vectors_written
                else ""
            )
            + f", reading the key columns of {sum(len(g.inputs) for g in conversion.groups)} "
            "data files"
        )
        for group_id, reason in sorted(conversion.conflicts.items()):
            out.print(f"equality delete group {group_id} left out: {reason}")
    verb = "would replace" if dry_run else "replaced"
    out.print(
        f"{where}: {verb} {result.files_removed} position delete files with "
        f"{result.files_added}; dropped {result.dangling_rows_dropped} rows that applied to "
        "no live data file"
    )
    print_table(
        f"delete files ({table})",
        ("kind", "before", "after"),
        (
            (kind.replace("_", " "), str(before), str(result.delete_files_after.get(kind, 0)))
            for kind, before in result.delete_files_before.items()
        ),
        right=("before", "after"),
    )
    for group_id, reason in sorted(result.conflicts.items()):
        out.print(f"partition group {group_id} left out: {reason}")


@commands.command("rewrite-manifests")
@with_model_flags(RewriteManifestsOptions)
@guarded
def rewrite_manifests(
    table: TableOpt,
    catalog: CatalogOpt = None,
    *,
    options: dict[str, Any],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Read the manifests and report; write nothing.")
    ] = False,
    exit_code_if_busy: BusyExitOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Rewrite the current snapshot's manifests into few, clustered by partition.

    Spark's rewrite_manifests: data manifests and delete manifests, separately per partition
    spec, are rewritten sorted by partition into manifests of about the table's
    commit.manifest.target-size-bytes (else 8 MiB), as one `replace` snapshot that adds and
    removes no file; every entry keeps its snapshot id and sequence numbers. Manifests already
    within the target and clustered are left alone (no snapshot). A concurrent append is kept;
    manifests a concurrent commit changed are left for the next run.

    Example: compactor rewrite-manifests --table db.events --dry-run
    """
    from compactor.api import rewrite_manifests as rewrite

    tbl = open_table(catalog, table)
    bar = _ManifestBar() if (not as_json and err.is_terminal) else None
    try:
        result = rewrite(tbl, dry_run=dry_run, progress=bar, **options)
    finally:
        if bar:
            bar.stop()
    if as_json:
        print_json(result.to_dict())
    if result.backed_off:
        back_off(result.backed_off, as_json, exit_code_if_busy)
    if as_json:
        return
    warn_in_doubt(table, result.commits_in_doubt)
    verb = "would replace" if dry_run else "replaced"
    out.print(
        f"{table}: {verb} {count(result.manifests_replaced, 'manifest')} with "
        f"{result.manifests_written} ({count(result.entries_rewritten, 'entry', 'entries')}); "
        f"{count(len(result.in_order), 'group')} already in order"
    )
    print_table(
        f"manifests ({table})",
        ("content", "before", "after", "live entries"),
        (
            (content, str(before), str(result.manifests_after.get(content, 0)), str(entries))
            for content, before in result.manifests_before.items()
            for entries in [result.entries.get(content, 0)]
        ),
        right=("before", "after", "live entries"),
    )
    for group_id, reason in sorted(result.conflicts.items()):
        out.print(f"manifest group {group_id} left out: {reason}")


class _ManifestBar:
    """Progress bar over the manifests read, on a terminal only."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress

        self._progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            transient=True,
        )
        self._task: Any = None

    def __call__(self, read: int, total: int) -> None:
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task("reading manifests", total=total)
        self._progress.update(self._task, completed=read)

    def stop(self) -> None:
        self._progress.stop()
