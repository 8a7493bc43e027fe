"""Rewrite position delete files: merge each partition's into one, drop dangling rows.

Iceberg Java's ``rewrite_position_delete_files`` with remove-dangling-deletes, for format-v2
tables. For the current snapshot, the Parquet position delete files (not deletion vectors) are
grouped by (spec id, partition); each group is read, and its rows are merged, sorted by
(``file_path``, ``pos``), de-duplicated and written into one new delete file (or several,
rolling at the target size).

What a reader deletes must not change. A row ``(path, pos)`` of a delete file with data sequence
number S is kept only if a live data file at ``path`` has a data sequence number <= S: other rows
never applied to a live row (the spec's rule), so they are dropped, and a delete file all of
whose rows are dropped is simply removed. The new files carry, explicitly on their manifest
entries, the largest data sequence number of the files they replace: every kept row's data file
has a sequence number <= its own delete's <= that maximum, so it still applies to exactly the
rows it did. A group of one delete file with no dangling row is left as it is.

Groups are left alone, and reported as skipped, when a row names a path that two live data files
share, or whose live data file is in another partition (readers differ on whether such a row
applies; a rewrite would pick one reading).

The commit is one ``replace`` snapshot on main: the replaced files' DELETED entries and the new
files in v2 delete manifests, the head's other manifests carried over. It is validated against
every snapshot committed since the start, per partition: a group is refused (its outputs deleted,
the other groups still committed) when one of its delete files is no longer live, a data file one
of its kept rows applies to was removed, or a data file was added at a path one of its rows names.
Catalog conflicts are retried after a refresh, re-validating each time. When the catalog cannot
tell whether the commit landed, every file stays (:class:`CommitStateUnknownError`).

The run takes the table's lease like a compaction run (:mod:`compactor.commit.inflight`): each
output is listed in an intent file (:mod:`compactor.rewrite.intent`) before it is created, and
each metadata file in the run record, so a killed run leaves nothing the next run and the orphan
sweep do not know of. Files are named ``compactor-<run id>-...`` as compaction outputs are.

A partition's delete rows are held in memory while it is rewritten (16 bytes plus the path per
row, the path dictionary-shared by Arrow per file).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import (
    INITIAL_SEQUENCE_NUMBER,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record

from compactor.commit.committer import CommitJournal, commit_on_branch, replace_snapshot
from compactor.commit.inflight import LeaseHeldError, PendingCommit
from compactor.commit.retry import RetryPolicy
from compactor.commit.run_scope import RunScope
from compactor.commit.snapshot_writer import SnapshotWriter, carry_over
from compactor.commit.validation import entries_added_by, missing_outputs, new_snapshots
from compactor.errors import (
    CommitConflictError,
    CompactorError,
    DataFileError,
    UnsupportedTableError,
    UsageError,
    first_line,
)
from compactor.iceberg.pyiceberg_compat import (
    POSITION_DELETE_FILE_PATH_ID,
    POSITION_DELETE_POS_ID,
    FilePruner,
    PartitionPath,
    file_statistics,
    manifest_entries,
    parquet_writer_kwargs,
    position_delete_schema,
)
from compactor.iceberg.value_keys import PartitionKey, partition_key, same_partition
from compactor.options import (
    DEFAULT_LEASE_TTL_S,
    SNAPSHOT_PROPERTY_ACTION,
    SNAPSHOT_PROPERTY_RUN_ID,
    SNAPSHOT_PROPERTY_TOOL,
)
from compactor.planning.health import delete_file_kinds
from compactor.planning.planner import is_unpartitioned, parse_where
from compactor.rewrite.intent import IntentLog
from compactor.sizes import parse_size

log = logging.getLogger(__name__)

DELETE_TARGET_FILE_SIZE_PROPERTY = "write.delete.target-file-size-bytes"
DEFAULT_DELETE_TARGET_FILE_SIZE = 64 * 1024 * 1024  # Iceberg's default
MANIFEST_READERS = 8
FILL_RATIO = 0.97
MAX_ROW_GROUP_ROWS = 1024 * 1024
MIN_ROW_GROUP_ROWS = 1024
# Java writes file_path and pos of position deletes with full metrics whatever the table says:
# readers use the file_path bounds to scope a delete file to one data file.
FULL_METRICS = {"write.metadata.metrics.default": "full"}
ACTION = "rewrite-position-deletes"

SINGLE_FILE = "single_delete_file_without_dangling_rows"
SHARED_PATH = "rows_name_a_path_of_several_live_data_files"
OTHER_PARTITION = "rows_name_a_data_file_of_another_partition"


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------


@dataclass
class DeleteGroup:
    """The live position delete files of one (spec, partition), and what rewriting them gives."""

    group_id: int
    spec_id: int
    partition: Record
    partition_path: str
    entries: list[ManifestEntry]
    manifests: frozenset[str] = frozenset()
    rows_read: int = 0
    dangling_rows: int = 0
    duplicate_rows: int = 0
    rows_written: int = 0
    # Data files (paths) the kept rows apply to, and every path any row names.
    target_paths: frozenset[str] = frozenset()
    referenced_paths: frozenset[str] = frozenset()
    outputs: list[DataFile] = field(default_factory=list)
    skipped: str | None = None

    @property
    def delete_files(self) -> list[DataFile]:
        return [e.data_file for e in self.entries]

    @property
    def paths(self) -> set[str]:
        return {e.data_file.file_path for e in self.entries}

    def expected_output_files(self, target_file_size: int) -> int:
        """Files the rewrite writes (or, not written yet, would: sized by the inputs' bytes)."""
        if self.outputs or not self.rows_written:
            return len(self.outputs)
        input_bytes = sum(d.file_size_in_bytes for d in self.delete_files)
        estimate = input_bytes * self.rows_written / max(self.rows_read, 1)
        return max(1, math.ceil(estimate / target_file_size))

    @property
    def data_sequence_number(self) -> int:
        """The largest data sequence number of the replaced files: the new files get it."""
        return max(_sequence_number(e) for e in self.entries)

    def summary(self, target_file_size: int) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "spec_id": self.spec_id,
            "partition": self.partition_path or "(unpartitioned)",
            "delete_files": len(self.entries),
            "data_sequence_number": self.data_sequence_number,
            "rows_read": self.rows_read,
            "dangling_rows": self.dangling_rows,
            "duplicate_rows": self.duplicate_rows,
            "rows_written": self.rows_written,
            "added_files": self.expected_output_files(target_file_size),
        }


@dataclass
class DeleteRewriteResult:
    """What ``rewrite_position_deletes`` did (or, with ``dry_run``, would do)."""

    table: str
    run_id: str
    dry_run: bool
    target_file_size: int
    start_snapshot_id: int | None = None
    snapshot_id: int | None = None
    delete_files_before: dict[str, int] = field(default_factory=dict)
    delete_files_after: dict[str, int] = field(default_factory=dict)
    groups: list[DeleteGroup] = field(default_factory=list)  # rewritten (or to be, dry run)
    committed: list[DeleteGroup] = field(default_factory=list)
    conflicts: dict[int, str] = field(default_factory=dict)  # group id -> why it was refused
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> partitions left alone
    recovered_files: list[str] = field(default_factory=list)
    # Commits of abandoned runs that may still land: their files were kept.
    commits_in_doubt: list[PendingCommit] = field(default_factory=list)
    attempts: int = 0
    duration_s: float = 0.0
    backed_off: str | None = None  # why the run did not start: another run holds the table

    @property
    def _done(self) -> list[DeleteGroup]:
        return self.groups if self.dry_run else self.committed

    @property
    def files_removed(self) -> int:
        return sum(len(g.entries) for g in self._done)

    @property
    def files_added(self) -> int:
        return sum(g.expected_output_files(self.target_file_size) for g in self._done)

    @property
    def bytes_removed(self) -> int:
        return sum(d.file_size_in_bytes for g in self._done for d in g.delete_files)

    @property
    def bytes_added(self) -> int:
        return sum(d.file_size_in_bytes for g in self._done for d in g.outputs)

    @property
    def dangling_rows_dropped(self) -> int:
        return sum(g.dangling_rows for g in self._done)

    def to_dict(self) -> dict[str, Any]:
        done = self._done
        return {
            "table": self.table,
            "action": ACTION,
            "dry_run": self.dry_run,
            "run_id": self.run_id,
            "start_snapshot_id": self.start_snapshot_id,
            "snapshot_id": self.snapshot_id,
            "target_file_size": self.target_file_size,
            "delete_files_before": dict(self.delete_files_before),
            "delete_files_after": dict(self.delete_files_after),
            "files_removed": self.files_removed,
            "files_added": self.files_added,
            "bytes_removed": self.bytes_removed,
            "bytes_added": self.bytes_added,
            "rows_read": sum(g.rows_read for g in done),
            "rows_written": sum(g.rows_written for g in done),
            "dangling_rows_dropped": self.dangling_rows_dropped,
            "duplicate_rows_dropped": sum(g.duplicate_rows for g in done),
            "groups": [g.summary(self.target_file_size) for g in self.groups],
            "committed_groups": len(self.committed),
            "conflicts": [
                {"group_id": gid, "reason": reason}
                for gid, reason in sorted(self.conflicts.items())
            ],
            "skipped": dict(self.skipped),
            "recovered_files": len(self.recovered_files),
            "commits_in_doubt": [c.to_dict() for c in self.commits_in_doubt],
            "attempts": self.attempts,
            "backed_off": self.backed_off,
            "duration_ms": round(self.duration_s * 1000),
        }


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def rewrite_position_deletes(
    table: Table,
    identifier: str,
    *,
    target_file_size: int | str | None = None,
    dry_run: bool = False,
    where: str | None = None,
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    run_id: str | None = None,
) -> DeleteRewriteResult:
    """Rewrite the position delete files of ``table``'s current snapshot, partition by partition.

    ``target_file_size`` (default: the table's ``write.delete.target-file-size-bytes``, else
    64 MiB) is where a new delete file rolls over; ``where`` limits the rewrite to the
    partitions a row filter may touch (partition values only: a delete file is never split).
    ``dry_run`` reads the delete files and reports what would change, writing nothing.

    Raises :class:`UnsupportedTableError` for format version 3 (deletion vectors),
    :class:`CommitStateUnknownError` when the catalog cannot tell whether the commit landed
    (every file is kept for the next run), :class:`DataFileError` for an unreadable delete file.
    Partitions refused because of a concurrent commit are reported in ``result.conflicts``;
    when a live run holds the table nothing is done and ``result.backed_off`` says why.
    """
    started = time.monotonic()
    metadata = table.metadata
    if metadata.format_version > 2:
        raise UnsupportedTableError(
            f"table {identifier}: format version {metadata.format_version} keeps position "
            "deletes as deletion vectors (one per data file), which rewrite-deletes does not "
            "merge; `compactor run` applies them and removes them with the files it rewrites"
        )
    target = _target_file_size(table, target_file_size)
    row_filter = parse_where(table, where)
    run_id = run_id or uuid.uuid4().hex[:12]
    result = DeleteRewriteResult(identifier, run_id, dry_run, target)
    if dry_run:
        scan = _plan(table, row_filter, result)
        for group in scan.groups:
            _rewrite_group(table, identifier, group, scan.live, result, writer=None)
        result.groups = [g for g in scan.groups if g.skipped is None]
        result.delete_files_after = _predicted_after(result)
        result.duration_s = time.monotonic() - started
        return result

    try:
        with RunScope(table, run_id, lease_ttl_s) as scope:
            scan = _plan(table, row_filter, result)
            scope.start_writing()
            for group in scan.groups:
                intent = IntentLog(table.io, table.metadata.location, run_id, group.group_id)
                writer = (run_id, intent.add, target)
                _rewrite_group(table, identifier, group, scan.live, result, writer)
            result.groups = [g for g in scan.groups if g.skipped is None]
            if result.groups:
                properties = {
                    SNAPSHOT_PROPERTY_TOOL: _version(),
                    SNAPSHOT_PROPERTY_RUN_ID: run_id,
                    SNAPSHOT_PROPERTY_ACTION: ACTION,
                }
                with scope.committing():
                    outcome = commit_delete_rewrite(
                        table,
                        identifier,
                        result.start_snapshot_id,
                        scan.start_manifests,
                        result.groups,
                        properties,
                        journal=scope.journal,
                    )
                    scope.keep(d.file_path for g in outcome.committed for d in g.outputs)
                result.snapshot_id = outcome.snapshot_id
                result.committed = outcome.committed
                result.conflicts = outcome.conflicts
                result.attempts = outcome.attempts
            result.delete_files_after = (
                _live_delete_kinds(table)
                if result.snapshot_id
                else dict(result.delete_files_before)
            )
    except LeaseHeldError as exc:  # nothing done: say why, as `compactor run` does
        result.backed_off = str(exc)
        result.duration_s = time.monotonic() - started
        return result
    result.recovered_files, result.commits_in_doubt = scope.recovered, scope.in_doubt
    result.duration_s = time.monotonic() - started
    return result


def _version() -> str:
    from compactor import __version__

    return __version__


def _target_file_size(table: Table, given: int | str | None) -> int:
    if given is None:
        given = table.metadata.properties.get(
            DELETE_TARGET_FILE_SIZE_PROPERTY, DEFAULT_DELETE_TARGET_FILE_SIZE
        )
        setting = DELETE_TARGET_FILE_SIZE_PROPERTY
    else:
        setting = "target_file_size"
    size = parse_size(given, setting)
    if size <= 0:
        raise UsageError(f"{setting}: must be positive, got {given!r}", "target_file_size")
    return size


def _sequence_number(entry: ManifestEntry) -> int:
    return entry.sequence_number or INITIAL_SEQUENCE_NUMBER


def _is_parquet_position_delete(delete_file: DataFile) -> bool:
    return (
        delete_file.content == DataFileContent.POSITION_DELETES
        and delete_file.file_format == FileFormat.PARQUET
        and getattr(delete_file, "content_offset", None) is None
    )


# --------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------


def _read_all(table: Table, manifests: list[ManifestFile]) -> list[tuple[str, ManifestEntry]]:
    io, version = table.io, table.metadata.format_version

    def read(manifest: ManifestFile) -> list[tuple[str, ManifestEntry]]:
        path = manifest.manifest_path
        return [(path, e) for e in manifest_entries(io, manifest, version)]

    with ThreadPoolExecutor(MANIFEST_READERS) as pool:
        return [item for items in pool.map(read, manifests) for item in items]


# Live data files by path: (data sequence number, spec id, partition) of each.
LiveData = dict[str, list[tuple[int, int, Record]]]


@dataclass
class _Scan:
    """The start snapshot: its manifests, live data files, and position delete groups."""

    start_manifests: frozenset[str] = frozenset()
    live: LiveData = field(default_factory=lambda: defaultdict(list))
    groups: list[DeleteGroup] = field(default_factory=list)


def _plan(table: Table, row_filter: Any, result: DeleteRewriteResult) -> _Scan:
    """The current snapshot's position delete files by (spec, partition); fills ``result``."""
    scan = _Scan()
    snapshot = table.current_snapshot()
    if snapshot is None:
        return scan
    result.start_snapshot_id = snapshot.snapshot_id
    metadata = table.metadata
    manifests = snapshot.manifests(table.io)
    scan.start_manifests = frozenset(m.manifest_path for m in manifests)
    entries = _read_all(table, manifests)
    live = scan.live
    candidates: dict[tuple[int, PartitionKey], list[tuple[str, ManifestEntry]]] = defaultdict(list)
    pruner = FilePruner(metadata, row_filter)
    deletes = []
    for manifest_path, entry in entries:
        data_file = entry.data_file
        if data_file.content == DataFileContent.DATA:
            live[data_file.file_path].append(
                (_sequence_number(entry), data_file.spec_id, data_file.partition)
            )
            continue
        deletes.append(data_file)
        if not _is_parquet_position_delete(data_file):
            continue
        if not pruner.partition_may_match(data_file):
            continue
        key = (data_file.spec_id, partition_key(data_file.partition))
        candidates[key].append((manifest_path, entry))
    result.delete_files_before = delete_file_kinds(deletes)
    groups = scan.groups
    specs, schema = metadata.specs(), metadata.schema()
    for (spec_id, _), found in candidates.items():
        partition = found[0][1].data_file.partition
        spec = specs[spec_id]
        path = "" if is_unpartitioned(spec) else spec.partition_to_path(partition, schema)
        found.sort(key=lambda item: (_sequence_number(item[1]), item[1].data_file.file_path))
        group = DeleteGroup(
            group_id=0,
            spec_id=spec_id,
            partition=partition,
            partition_path=path,
            entries=[e for _, e in found],
            manifests=frozenset(m for m, _ in found),
        )
        groups.append(group)
    groups.sort(key=lambda g: (-len(g.entries), g.spec_id, g.partition_path))
    for number, group in enumerate(groups):
        group.group_id = number
    return scan


# --------------------------------------------------------------------------------------------
# Reading and writing one group
# --------------------------------------------------------------------------------------------


def _read_delete_file(table: Table, identifier: str, entry: ManifestEntry) -> pa.Table:
    """``file_path`` and ``pos`` of one position delete file, with its data sequence number."""
    delete_file = entry.data_file
    path = delete_file.file_path
    try:
        with table.io.new_input(path).open() as stream:
            parquet = pq.ParquetFile(stream)
            arrow_schema = parquet.schema_arrow
            for name, field_id in (
                ("file_path", POSITION_DELETE_FILE_PATH_ID),
                ("pos", POSITION_DELETE_POS_ID),
            ):
                index = arrow_schema.get_field_index(name)
                if index < 0:
                    raise DataFileError(
                        f"table {identifier}: position delete file {path} has no {name} column"
                    )
                meta = arrow_schema.field(index).metadata or {}
                written_id = meta.get(b"PARQUET:field_id")
                if written_id is not None and int(written_id) != field_id:
                    raise DataFileError(
                        f"table {identifier}: position delete file {path}: column {name} has "
                        f"field id {int(written_id)}, not {field_id}"
                    )
            data = parquet.read(columns=["file_path", "pos"])
    except CompactorError:
        raise
    except Exception as exc:
        raise DataFileError(
            f"table {identifier}: cannot read position delete file {path}: {first_line(exc)}"
        ) from exc
    if data.num_rows != delete_file.record_count:
        raise DataFileError(
            f"table {identifier}: position delete file {path} holds {data.num_rows} rows, its "
            f"manifest entry says {delete_file.record_count}"
        )
    file_path = data.column("file_path")
    if pa.types.is_dictionary(file_path.type):
        file_path = file_path.cast(pa.string())
    return pa.table(
        {
            "file_path": file_path.cast(pa.string()),
            "pos": data.column("pos").cast(pa.int64()),
            "seq": pa.array([_sequence_number(entry)] * data.num_rows, pa.int64()),
        }
    )


def _kept_rows(
    group: DeleteGroup, rows: pa.Table, live: LiveData
) -> tuple[pa.Table | None, str | None]:
    """The rows that still apply to a live data file, unique and sorted; or why to leave it."""
    unique_paths = pc.unique(rows.column("file_path")).to_pylist()
    live_seqs: list[int | None] = []
    for path in unique_paths:
        files = live.get(path, [])
        if len(files) > 1:
            return None, SHARED_PATH
        if files:
            seq, spec_id, partition = files[0]
            if spec_id != group.spec_id or not same_partition(partition, group.partition):
                return None, OTHER_PARTITION
            live_seqs.append(seq)
        else:
            live_seqs.append(None)
    group.referenced_paths = frozenset(unique_paths)
    indices = pc.index_in(rows.column("file_path"), value_set=pa.array(unique_paths, pa.string()))
    data_seq = pc.take(pa.array(live_seqs, pa.int64()), indices)
    applies = pc.fill_null(pc.less_equal(data_seq, rows.column("seq")), False)
    kept = rows.filter(applies).select(["file_path", "pos"])
    group.rows_read = rows.num_rows
    group.dangling_rows = rows.num_rows - kept.num_rows
    unique = kept.group_by(["file_path", "pos"]).aggregate([])
    group.duplicate_rows = kept.num_rows - unique.num_rows
    unique = unique.sort_by([("file_path", "ascending"), ("pos", "ascending")])
    # The data files the new file applies to: those with a kept row.
    group.target_paths = frozenset(pc.unique(unique.column("file_path")).to_pylist())
    return unique, None


def _rewrite_group(
    table: Table,
    identifier: str,
    group: DeleteGroup,
    live: LiveData,
    result: DeleteRewriteResult,
    writer: tuple[str, Callable[[str], None], int] | None,
) -> None:
    """Read the group's delete files; decide; write its new file(s) unless ``writer`` is None."""
    rows = pa.concat_tables([_read_delete_file(table, identifier, e) for e in group.entries])
    unique, reason = _kept_rows(group, rows, live)
    del rows
    if reason is None and len(group.entries) == 1 and group.dangling_rows == 0:
        reason = SINGLE_FILE
    if reason is not None:
        group.skipped = reason
        result.skipped[reason] = result.skipped.get(reason, 0) + 1
        return
    assert unique is not None
    group.rows_written = unique.num_rows
    if writer is None or unique.num_rows == 0:
        return
    run_id, on_create, target = writer
    group.outputs = _write_delete_files(table, group, unique, run_id, on_create, target)


def _write_delete_files(
    table: Table,
    group: DeleteGroup,
    rows: pa.Table,
    run_id: str,
    on_create: Callable[[str], None],
    target_file_size: int,
) -> list[DataFile]:
    """Write sorted ``rows`` into Parquet position delete files rolling at the target size."""
    metadata = table.metadata
    file_schema, arrow_schema = position_delete_schema()
    rows = rows.cast(arrow_schema)
    kwargs = parquet_writer_kwargs(metadata.properties)
    spec = metadata.specs()[group.spec_id]
    key = None
    if not is_unpartitioned(spec):
        key = PartitionPath(spec, metadata.schema(), group.partition)
    locations = table.location_provider()
    outputs: list[DataFile] = []
    offset, counter = 0, 0
    # On-disk bytes per row: from the inputs until the first row group tells.
    input_bytes = sum(d.file_size_in_bytes for d in group.delete_files)
    bytes_per_row = input_bytes / max(group.rows_read, 1)
    while offset < rows.num_rows:
        first_row = offset
        name = (
            f"compactor-{run_id}-d{group.group_id:04d}-{counter:05d}-"
            f"{uuid.uuid4().hex[:8]}-deletes.parquet"
        )
        counter += 1
        path = locations.new_data_location(name, key)  # type: ignore[arg-type]
        on_create(path)
        with table.io.new_output(path).create(overwrite=False) as stream:
            parquet = pq.ParquetWriter(stream, schema=arrow_schema, **kwargs)
            try:
                while offset < rows.num_rows:
                    written = stream.tell()
                    room = max(target_file_size - written, 0) / max(bytes_per_row, 1e-3)
                    chunk = min(MAX_ROW_GROUP_ROWS, max(MIN_ROW_GROUP_ROWS, int(room)))
                    part = rows.slice(offset, chunk)
                    parquet.write_table(part, row_group_size=max(part.num_rows, 1))
                    offset += part.num_rows
                    after = stream.tell()
                    if after > written:
                        bytes_per_row = after / (offset - first_row)
                    if after >= target_file_size * FILL_RATIO:
                        break
            finally:
                parquet.close()
            size = stream.tell()
        stats = file_statistics(parquet.writer.metadata, file_schema, FULL_METRICS)
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=group.partition,
            file_size_in_bytes=size,
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
            **stats,
        )
        delete_file.spec_id = group.spec_id
        outputs.append(delete_file)
    return outputs


# --------------------------------------------------------------------------------------------
# Commit
# --------------------------------------------------------------------------------------------


@dataclass
class DeleteCommitOutcome:
    snapshot_id: int | None = None
    committed: list[DeleteGroup] = field(default_factory=list)
    conflicts: dict[int, str] = field(default_factory=dict)
    attempts: int = 0


def find_delete_conflicts(
    table: Table,
    start_snapshot_id: int | None,
    groups: Iterable[DeleteGroup],
    head: Snapshot | None,
) -> dict[int, str]:
    """Group id -> why committing it now would be wrong, from every snapshot since the start."""
    conflicts: dict[int, str] = {}
    groups = list(groups)
    if head is None or head.snapshot_id == start_snapshot_id or not groups:
        return conflicts
    replaced = {p: g.group_id for g in groups for p in g.paths}
    targets: dict[str, list[int]] = defaultdict(list)
    referenced: dict[str, list[int]] = defaultdict(list)
    for g in groups:
        for p in g.target_paths:
            targets[p].append(g.group_id)
        for p in g.referenced_paths:
            referenced[p].append(g.group_id)
    for snapshot in new_snapshots(table, start_snapshot_id, head, MAIN_BRANCH):
        sid = snapshot.snapshot_id
        for entry in entries_added_by(table, snapshot):
            path = entry.data_file.file_path
            content = entry.data_file.content
            if entry.status == ManifestEntryStatus.DELETED:
                if path in replaced:
                    conflicts.setdefault(
                        replaced[path], f"delete file {path} was removed by snapshot {sid}"
                    )
                if content == DataFileContent.DATA:
                    for gid in targets.get(path, ()):
                        conflicts.setdefault(
                            gid, f"data file {path} it applies to was removed by snapshot {sid}"
                        )
            elif entry.status == ManifestEntryStatus.ADDED and content == DataFileContent.DATA:
                for gid in referenced.get(path, ()):
                    conflicts.setdefault(
                        gid, f"data file {path} its rows name was added by snapshot {sid}"
                    )
    return conflicts


def commit_delete_rewrite(
    table: Table,
    identifier: str,
    start_snapshot_id: int | None,
    start_manifests: frozenset[str],
    groups: list[DeleteGroup],
    snapshot_properties: dict[str, str],
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    journal: CommitJournal | None = None,
) -> DeleteCommitOutcome:
    """Commit the rewritten ``groups`` as one ``replace`` snapshot; refused groups are reported.

    The caller owns the outputs of refused groups and deletes them. ``journal`` records files
    and catalog calls first (:func:`compactor.commit.committer.commit_on_branch`). Raises
    :class:`CommitStateUnknownError` when the catalog cannot tell whether the commit landed.
    """
    outcome = DeleteCommitOutcome()
    pending = {g.group_id: g for g in groups}

    def prepare() -> Snapshot | None:
        outcome.attempts += 1
        if table.metadata.format_version > 2:
            raise CommitConflictError(
                f"table {identifier}: upgraded to format version "
                f"{table.metadata.format_version} during the rewrite; nothing committed"
            )
        head = table.metadata.snapshot_by_name(MAIN_BRANCH)
        if head is None:
            raise CommitConflictError(f"table {identifier}: main has no snapshot any more")
        refused = find_delete_conflicts(table, start_snapshot_id, pending.values(), head)
        refused.update(missing_outputs(table, {g.group_id: g.outputs for g in pending.values()}))
        for group_id, reason in refused.items():
            outcome.conflicts.setdefault(group_id, reason)
            pending.pop(group_id, None)
        return head if pending else None

    def build(attempt: SnapshotWriter, head: Snapshot) -> Snapshot | None:
        return _write_snapshot(
            attempt, head, start_manifests, pending, outcome, snapshot_properties
        )

    outcome.snapshot_id = commit_on_branch(
        table,
        identifier,
        prepare,
        build,
        retry=retry or RetryPolicy.for_table(table),
        sleep=sleep,
        journal=journal,
    )
    if outcome.snapshot_id is not None:
        outcome.committed = list(pending.values())
    return outcome


def _filter_delete_manifests(
    attempt: SnapshotWriter, head: Snapshot, remove: set[str], read: set[str], start: frozenset[str]
) -> tuple[list[ManifestFile], dict[str, ManifestEntry]]:
    """Carry the head's manifests over without ``remove``; returns them and the entries removed.

    Data manifests and delete manifests of the start snapshot that held none of ``remove``
    (those not in ``read``) are kept as they are; the others are read, and rewritten with their
    remaining entries as EXISTING when they held one.
    """
    io = attempt.table.io
    manifests: list[ManifestFile] = []
    found: dict[str, ManifestEntry] = {}
    for manifest in head.manifests(io):
        if manifest.content != ManifestContent.DELETES or (
            manifest.manifest_path not in read and manifest.manifest_path in start
        ):
            manifests.append(manifest)
            continue
        carried = carry_over(attempt, manifest, remove, found)
        if carried is not None:
            manifests.append(carried)
    return manifests, found


def _write_snapshot(
    attempt: SnapshotWriter,
    head: Snapshot,
    start_manifests: frozenset[str],
    pending: dict[int, DeleteGroup],
    outcome: DeleteCommitOutcome,
    snapshot_properties: dict[str, str],
) -> Snapshot | None:
    group_of = {p: gid for gid, g in pending.items() for p in g.paths}
    read = {m for g in pending.values() for m in g.manifests}
    manifests, found = _filter_delete_manifests(attempt, head, set(group_of), read, start_manifests)
    missing = {gid for path, gid in group_of.items() if path not in found}
    if missing:
        for gid in missing:
            outcome.conflicts[gid] = "a replaced delete file is no longer live in the table"
            pending.pop(gid)
        attempt.discard()
        return None

    by_spec: dict[int, list[ManifestEntry]] = defaultdict(list)
    added: list[DataFile] = []
    removed: list[DataFile] = []
    for group in pending.values():
        for data_file in group.outputs:
            added.append(data_file)
            by_spec[group.spec_id].append(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=attempt.snapshot_id,
                    sequence_number=group.data_sequence_number,
                    file_sequence_number=None,
                    data_file=data_file,
                )
            )
        for path in sorted(group.paths):
            entry = found[path]
            removed.append(entry.data_file)
            by_spec[entry.data_file.spec_id].append(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.DELETED,
                    snapshot_id=attempt.snapshot_id,
                    sequence_number=entry.sequence_number,
                    file_sequence_number=entry.file_sequence_number,
                    data_file=entry.data_file,
                )
            )
    changes = []
    for spec_id, entries in sorted(by_spec.items()):
        with attempt.manifest_writer(spec_id, ManifestContent.DELETES) as writer:
            for entry in entries:
                writer.add_entry(entry)
        changes.append(writer.to_manifest_file())
    return replace_snapshot(attempt, head, changes + manifests, added, removed, snapshot_properties)


# --------------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------------


def _live_delete_kinds(table: Table) -> dict[str, int]:
    snapshot = table.current_snapshot()
    if snapshot is None:
        return delete_file_kinds([])
    manifests = [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DELETES]
    return delete_file_kinds(e.data_file for _, e in _read_all(table, manifests))


def _predicted_after(result: DeleteRewriteResult) -> dict[str, int]:
    after = Counter(result.delete_files_before)
    after["position"] += result.files_added - result.files_removed
    return dict(after)
