"""Plan a compaction: read the snapshot's manifests, pick candidate files, bin-pack them.

A :class:`Plan` names the snapshot it was made from, every input file with the position deletes
that apply to it, and the groups to rewrite. It stays in the driver: besides the groups it keeps
what only the commit needs (which manifest lists each input, the start snapshot's manifests,
which data files each delete file applies to). What leaves the driver are
:class:`compactor.planning.tasks.RewriteTask` objects made from its groups.

Data manifests are read without column metrics (:mod:`compactor.iceberg.manifest_decoder`) a
few at a time, and each candidate is kept as a :class:`PlannedFile`, about 350 bytes. A run
keeps at most ``max_candidate_files`` of them (from its memory limit): the candidates found
past that are counted in :attr:`Plan.deferred_files` and left for the next run, while the rest
of the manifests is still read for the delete files' targets. The commit reads the full
entries again, from the manifests that hold rewritten files.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from operator import attrgetter
from typing import Any

from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.parser import parse as parse_filter
from pyiceberg.expressions.visitors import bind, extract_field_ids
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    INITIAL_SEQUENCE_NUMBER,
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestFile,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.transforms import VoidTransform
from pyiceberg.typedef import Record

from compactor.errors import UsageError, first_line
from compactor.iceberg.interop import refuse_fixed_partitions
from compactor.iceberg.manifest_decoder import planning_entries, read_in_order
from compactor.iceberg.pyiceberg_compat import (
    POSITION_DELETE_FILE_PATH_ID,
    FilePruner,
    PositionDeleteIndex,
    delete_file_key,
    first_row_id,
    is_deletion_vector,
    manifest_entries,
    record_values,
    referenced_data_file,
    snapshot_manifests,
)
from compactor.iceberg.value_keys import PartitionKey, partition_key
from compactor.options.compact import PlanOptions
from compactor.planning.sort_order import Clustering, resolve_clustering

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TaskInput:
    """One input data file, its sequence numbers and the delete files that apply to it.

    ``file_sequence_number`` is what a v3 row without a ``_last_updated_sequence_number``
    inherits (as Iceberg Java reads it).
    """

    data_file: DataFile
    data_sequence_number: int
    delete_files: tuple[DataFile, ...] = ()
    file_sequence_number: int | None = None

    @property
    def path(self) -> str:
        return self.data_file.file_path

    @property
    def lineage_sequence_number(self) -> int:
        """What a v3 row without a ``_last_updated_sequence_number`` inherits."""
        if self.file_sequence_number is None:
            return self.data_sequence_number
        return self.file_sequence_number

    @property
    def size(self) -> int:
        return self.data_file.file_size_in_bytes

    @property
    def record_count(self) -> int:
        return self.data_file.record_count


@dataclass(frozen=True, slots=True)
class InputFile(TaskInput):
    """A task input as the driver sees it: also where its manifest entry is, for the commit."""

    manifest_path: str = ""
    entry: ManifestEntry | None = None


# A data file's values but its own (path, counts, first row id), then its spec id: what the
# data files of one partition written alike share.
Shape = tuple[Any, ...]
# Where a data file's own values are among its fields (v2's fields are the first of v3's).
_POSITIONS = {f.name: i for i, f in enumerate(DATA_FILE_TYPE[3].fields)}
_PARTITION = _POSITIONS["partition"]
_OWN = tuple(
    _POSITIONS[name] for name in ("file_path", "record_count", "file_size_in_bytes", "first_row_id")
)


class PlannedFile(InputFile):
    """An input as planning keeps a million of them, read from ``manifest_path``.

    It keeps its data file's own values (the path as UTF-8 bytes, 16 bytes less than a str and
    sorted alike; counts; first row id) beside the :data:`Shape` the files of its partition
    share, and builds the ``DataFile`` when asked for it. A data file with values of its own
    (column metrics) is kept whole instead.
    """

    __slots__ = ("_shape", "path_bytes", "_records", "_size", "_first_row_id")
    _shape: Shape | DataFile
    path_bytes: bytes
    _records: int
    _size: int
    _first_row_id: int | None

    def __init__(
        self,
        data_file: DataFile,
        data_sequence_number: int,
        delete_files: tuple[DataFile, ...],
        file_sequence_number: int | None,
        manifest_path: str,
        shape: Shape | None,
    ) -> None:
        for name, value in (
            ("data_sequence_number", data_sequence_number),
            ("delete_files", delete_files),
            ("file_sequence_number", file_sequence_number),
            ("manifest_path", manifest_path),
            ("entry", None),
            ("_shape", data_file if shape is None else shape),
            ("path_bytes", data_file.file_path.encode()),
            ("_records", data_file.record_count),
            ("_size", data_file.file_size_in_bytes),
            ("_first_row_id", first_row_id(data_file)),
        ):
            object.__setattr__(self, name, value)

    @property
    def data_file(self) -> DataFile:
        if isinstance(self._shape, DataFile):
            return self._shape
        *values, spec_id = self._shape
        own = (self.path, self._records, self._size, self._first_row_id)
        for position, value in zip(_OWN, own, strict=True):
            if position < len(values):
                values[position] = value
        data_file = DataFile(*values)
        data_file.spec_id = spec_id
        return data_file

    @property
    def path(self) -> str:
        return self.path_bytes.decode()

    @property
    def size(self) -> int:
        return self._size

    @property
    def record_count(self) -> int:
        return self._records


def shared_shape(data_file: DataFile, key: PartitionKey, shapes: dict[Any, Shape]) -> Shape | None:
    """``data_file``'s :data:`Shape` for :class:`PlannedFile`, the one instance in ``shapes`` of
    the files of partition ``key`` written alike; None when it has values of its own (column
    metrics)."""
    values = list(record_values(data_file))
    for position in _OWN:
        if position < len(values):
            values[position] = None
    values[_PARTITION] = key
    lookup = (*values, data_file.spec_id)
    try:
        shape = shapes.get(lookup)
    except TypeError:  # metrics maps
        return None
    if shape is None:
        values[_PARTITION] = data_file.partition
        shape = shapes[lookup] = (*values, data_file.spec_id)
    return shape


@dataclass
class FileGroup:
    """Files of one partition (of one spec) rewritten together into target-size files."""

    group_id: int
    spec_id: int
    partition: Record
    partition_path: str
    files: list[InputFile]
    target_file_size: int
    # Files of other specs rewritten into ``spec_id``: their rows are split by its partitions.
    repartition: bool = False

    @property
    def partition_label(self) -> str:
        """The partition as shown: its path, or ``(unpartitioned)``."""
        return self.partition_path or "(unpartitioned)"

    @property
    def input_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def input_records(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def delete_files(self) -> dict[str, DataFile]:
        """The delete files of the group's inputs, by :func:`delete_file_key`."""
        return {delete_file_key(d): d for f in self.files for d in f.delete_files}

    @property
    def expected_output_files(self) -> int:
        return max(1, math.ceil(self.input_bytes / self.target_file_size))

    @property
    def inputs(self) -> frozenset[str]:
        """What the group reads: its data files and the delete files that apply to them."""
        return frozenset(f.path for f in self.files) | frozenset(self.delete_files)

    def summary(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "spec_id": self.spec_id,
            "partition": self.partition_label,
            "repartition": self.repartition,
            "input_files": len(self.files),
            "input_bytes": self.input_bytes,
            "input_records": self.input_records,
            "delete_files": len(self.delete_files),
            "expected_output_files": self.expected_output_files,
        }


@dataclass
class CommitContext:
    """What only the committer needs of a plan, kept by the driver and never sent to a task:
    which manifests the start snapshot had, and which delete files touch the planned inputs."""

    # Delete files touching planned inputs, by delete_file_key -> every live data file they
    # apply to.
    delete_file_targets: dict[str, tuple[DataFile, frozenset[str]]] = field(default_factory=dict)
    # Every manifest of the start snapshot, and the live entries of those read while planning.
    start_manifests: frozenset[str] = frozenset()
    manifest_live_entries: dict[str, int] = field(default_factory=dict)


@dataclass
class Plan:
    """What a run will rewrite, made from one snapshot of the table (``metadata``).

    Its groups become the run's tasks; what only the committer needs of the same reading is
    the :class:`CommitContext` planned beside it.
    """

    table: str
    snapshot_id: int | None
    sequence_number: int
    format_version: int
    options: PlanOptions
    metadata: TableMetadata
    metadata_location: str
    groups: list[FileGroup] = field(default_factory=list)
    # Data sequence number of every equality delete an input has, by path (tasks carry them).
    equality_delete_sequence_numbers: dict[str, int] = field(default_factory=dict)
    data_files_scanned: int = 0
    # Candidates found past options.max_candidate_files: left for the next run.
    deferred_files: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # The order each group's rows are written in (strategy sort or zorder); None: bin-pack.
    clustering: Clustering | None = None
    # The inputs of groups left out because the same inputs grew when last rewritten.
    grown_before: list[frozenset[str]] = field(default_factory=list)

    @property
    def input_files(self) -> int:
        return sum(len(g.files) for g in self.groups)

    def group(self, group_id: int) -> FileGroup:
        """The group with ``group_id`` (a task's ``task_id``)."""
        group = self.groups[group_id] if 0 <= group_id < len(self.groups) else None
        if group is None or group.group_id != group_id:
            group = next(g for g in self.groups if g.group_id == group_id)
        return group

    @property
    def input_bytes(self) -> int:
        return sum(g.input_bytes for g in self.groups)

    def summary(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "target_file_size": self.options.target_file_size,
            "branch": self.options.branch,
            "strategy": self.options.strategy,
            "order": self.clustering.describe() if self.clustering else None,
            "data_files_scanned": self.data_files_scanned,
            "deferred_files": self.deferred_files,
            "groups": [g.summary() for g in self.groups],
            "input_files": self.input_files,
            "input_bytes": self.input_bytes,
            "expected_output_files": sum(g.expected_output_files for g in self.groups),
            "skipped": dict(self.skipped),
        }


def parse_where(table: Table, where: str | None) -> BooleanExpression:
    """Parse and bind a ``where`` filter against the table's schema, or fail clearly."""
    if not where:
        return AlwaysTrue()
    try:
        expression = parse_filter(where)
        bind(table.schema(), expression, case_sensitive=True)
    except Exception as exc:  # pyparsing and binding raise several unrelated types
        raise UsageError(f"where {where!r}: {first_line(exc)}", "where") from None
    return expression


@dataclass
class _DeleteScan:
    """The delete files of a snapshot's delete manifests, indexed for matching data files."""

    live_entries: dict[str, int] = field(default_factory=dict)
    position_deletes: PositionDeleteIndex = field(default_factory=PositionDeleteIndex)
    has_position_deletes: bool = False
    # Deletion vectors by the data file they name, with their data sequence numbers.
    deletion_vectors: dict[str, list[tuple[int, DataFile]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    equality_deletes: list[ManifestEntry] = field(default_factory=list)
    delete_files: list[DataFile] = field(default_factory=list)


ReadManifest = Callable[[FileIO, ManifestFile, int], list[ManifestEntry]]


def read_manifests(
    table: Table, manifests: Iterable[ManifestFile], read: ReadManifest = manifest_entries
) -> Iterator[tuple[ManifestFile, list[ManifestEntry]]]:
    """Each of ``manifests`` with its live entries (as ``read`` reads them), in order
    (:func:`~compactor.iceberg.manifest_decoder.read_in_order`)."""
    io, version = table.io, table.metadata.format_version
    return read_in_order(lambda manifest: read(io, manifest, version), manifests)


def _read_delete_manifests(table: Table, manifests: Iterable[ManifestFile]) -> _DeleteScan:
    scan = _DeleteScan()
    for manifest, entries in read_manifests(table, manifests):
        scan.live_entries[manifest.manifest_path] = len(entries)
        for entry in entries:
            content = entry.data_file.content
            scan.delete_files.append(entry.data_file)
            if is_deletion_vector(entry.data_file):
                seq = entry.sequence_number or INITIAL_SEQUENCE_NUMBER
                target = referenced_data_file(entry.data_file) or ""
                scan.deletion_vectors[target].append((seq, entry.data_file))
            elif content == DataFileContent.POSITION_DELETES:
                scan.position_deletes.add_delete_file(entry)
                scan.has_position_deletes = True
            else:
                scan.equality_deletes.append(entry)
    return scan


def _metric_ids(
    table: Table, row_filter: BooleanExpression, clustering: Clustering | None
) -> frozenset[int]:
    """The columns whose metrics planning and the tasks read: those ``row_filter`` prunes by,
    and the z-order columns (their bounds scale each group's z-values)."""
    ids = extract_field_ids(bind(table.schema(), row_filter, case_sensitive=True))
    if clustering is not None and clustering.strategy == "zorder":
        ids |= {f.field_id for f in clustering.fields}
    return frozenset(ids)


def is_unpartitioned(spec: PartitionSpec) -> bool:
    """Whether ``spec`` partitions nothing: no fields, or only ``void`` ones (spec and Java).

    pyiceberg's ``is_unpartitioned()`` counts fields only, but a v1 table whose partition
    fields were dropped keeps them as ``void``; its equality deletes apply globally.
    """
    return all(isinstance(f.transform, VoidTransform) for f in spec.fields)


def _applies_globally(delete_file: DataFile, specs: dict[int, PartitionSpec]) -> bool:
    """Whether ``delete_file`` is an equality delete of an unpartitioned spec (it applies to
    every partition)."""
    if delete_file.content != DataFileContent.EQUALITY_DELETES:
        return False
    return is_unpartitioned(specs[delete_file.spec_id])


def partition_path(spec: PartitionSpec, schema: Schema, partition: Record) -> str:
    """``partition`` of ``spec`` as a path (``region=eu``); empty when ``spec`` is unpartitioned."""
    return "" if is_unpartitioned(spec) else spec.partition_to_path(partition, schema)


class EqualityDeleteIndex:
    """Which equality deletes apply to a data file, by the spec's scoping rules.

    A delete applies to data files with a strictly lower data sequence number, in its partition
    (same spec and partition tuple, compared by :func:`partition_key`), or to every partition
    when its spec is unpartitioned.
    """

    def __init__(self, specs: dict[int, PartitionSpec], entries: Iterable[ManifestEntry]) -> None:
        self.global_deletes: list[tuple[int, DataFile]] = []
        self.by_partition: defaultdict[tuple[int, PartitionKey], list[tuple[int, DataFile]]]
        self.by_partition = defaultdict(list)
        self.sequence_numbers: dict[str, int] = {}
        for entry in entries:
            seq = entry.sequence_number or INITIAL_SEQUENCE_NUMBER
            delete_file = entry.data_file
            self.sequence_numbers[delete_file.file_path] = seq
            if is_unpartitioned(specs[delete_file.spec_id]):
                self.global_deletes.append((seq, delete_file))
            else:
                key = (delete_file.spec_id, partition_key(delete_file.partition))
                self.by_partition[key].append((seq, delete_file))

    def for_data_file(self, entry: ManifestEntry) -> list[DataFile]:
        if not self.sequence_numbers:
            return []
        seq = entry.sequence_number or INITIAL_SEQUENCE_NUMBER
        key = (entry.data_file.spec_id, partition_key(entry.data_file.partition))
        scoped = self.global_deletes + self.by_partition.get(key, [])
        return [d for delete_seq, d in scoped if delete_seq > seq]


def _top_level_ids(schema: Schema) -> set[int]:
    return {f.field_id for f in schema.fields}


def file_scoped_deleted_rows(data_file: DataFile, deletes: Iterable[DataFile]) -> int:
    """Rows of ``data_file`` its file-scoped position deletes remove (at most its record count).

    As Java's planner: a deletion vector, or a position delete file whose ``file_path`` bounds
    are both this file's path, deletes only rows of this file, so its record count counts;
    others are not counted.
    """
    return _file_scoped_deleted_rows(data_file.file_path, data_file.record_count, deletes)


def _file_scoped_deleted_rows(path: str, record_count: int, deletes: Iterable[DataFile]) -> int:
    encoded = path.encode()
    rows = 0
    for d in deletes:
        if d.content != DataFileContent.POSITION_DELETES:
            continue
        lower, upper = (d.lower_bounds or {}), (d.upper_bounds or {})
        if referenced_data_file(d) == path or (
            lower.get(POSITION_DELETE_FILE_PATH_ID)
            == upper.get(POSITION_DELETE_FILE_PATH_ID)
            == encoded
        ):
            rows += d.record_count
    return min(rows, record_count)


def too_many_deletes(
    data_file: DataFile, deletes: Sequence[DataFile], options: PlanOptions
) -> bool:
    """Whether a file's deletes make it a candidate whatever its size (Spark's thresholds)."""
    return _too_many_deletes(data_file.file_path, data_file.record_count, deletes, options)


def _too_many_deletes(
    path: str, record_count: int, deletes: Sequence[DataFile], options: PlanOptions
) -> bool:
    threshold = options.delete_file_threshold
    if threshold is not None and len(deletes) >= threshold:
        return True
    deleted = _file_scoped_deleted_rows(path, record_count, deletes)
    return record_count > 0 and deleted / record_count >= options.delete_ratio_threshold


def _pack(files: list[InputFile], max_group_size: int) -> list[list[InputFile]]:
    """Fill groups in write order up to ``max_group_size`` (keeps clustered data together).

    Files that all fit in one group are that group: ``files`` itself, not a copy.
    """
    if files and sum(f.size for f in files) <= max_group_size:
        return [files]
    bins: list[list[InputFile]] = [[]]
    size = 0
    for f in files:
        if bins[-1] and size + f.size > max_group_size:
            bins.append([])
            size = 0
        bins[-1].append(f)
        size += f.size
    return [b for b in bins if b]


def branch_head(table: Table, identifier: str, branch: str) -> Snapshot | None:
    """The snapshot ``branch`` points at (None: main of a table with no snapshot yet)."""
    ref = table.metadata.refs.get(branch)
    if ref is None:
        if branch == MAIN_BRANCH:
            return None
        branches = sorted(
            n
            for n, r in table.metadata.refs.items()
            if r.snapshot_ref_type == SnapshotRefType.BRANCH
        )
        raise UsageError(
            f"table {identifier}: no branch {branch!r} (branches: {', '.join(branches) or 'none'})",
            "branch",
        )
    if ref.snapshot_ref_type != SnapshotRefType.BRANCH:
        raise UsageError(
            f"table {identifier}: {branch!r} is a tag; compactor commits to branches only",
            "branch",
        )
    return table.metadata.snapshot_by_id(ref.snapshot_id)


def _output_spec_id(metadata: TableMetadata, identifier: str, options: PlanOptions) -> int | None:
    """The partition spec files of other specs are rewritten into, if any (checked)."""
    wanted = options.output_spec_id
    if wanted is not None and wanted not in metadata.specs():
        known = ", ".join(map(str, sorted(metadata.specs())))
        raise UsageError(
            f"table {identifier}: output_spec_id {wanted}: no such partition spec "
            f"(specs: {known}; current: {metadata.default_spec_id})",
            "output_spec_id",
        )
    if wanted is not None:
        partition_type = metadata.specs()[wanted].partition_type(metadata.schema())
        refuse_fixed_partitions(partition_type, f"table {identifier}: output_spec_id {wanted}")
    return wanted


def plan_rewrite(
    table: Table,
    identifier: str,
    options: PlanOptions,
    grown_before: Collection[frozenset[str]] = (),
    exclude: Collection[str] = (),
) -> tuple[Plan, CommitContext]:
    """Plan the rewrite of the head of ``table``'s branch (``options.branch``, main by default),
    and the committer's context of that plan, which the driver keeps.

    A group whose :attr:`FileGroup.inputs` are in ``grown_before`` (groups whose rewrite grew
    in an earlier run) is left out: rewriting the same files the same way would grow again.
    Data files in ``exclude``, or with a delete file in it, are left out (quarantined files).
    """
    metadata = table.metadata
    row_filter = parse_where(table, options.where)
    snapshot = branch_head(table, identifier, options.branch)
    plan = Plan(
        table=identifier,
        snapshot_id=snapshot.snapshot_id if snapshot else None,
        sequence_number=snapshot.sequence_number or INITIAL_SEQUENCE_NUMBER if snapshot else 0,
        format_version=metadata.format_version,
        options=options,
        metadata=metadata,
        metadata_location=table.metadata_location,
        clustering=resolve_clustering(
            metadata, identifier, options.strategy, options.sort_order, options.zorder
        ),
    )
    context = CommitContext()
    output_spec = _output_spec_id(metadata, identifier, options)
    if snapshot is None:
        return plan, context

    pruner = FilePruner(metadata, row_filter)
    all_manifests = snapshot_manifests(table.io, snapshot, metadata.format_version)
    context.start_manifests = frozenset(m.manifest_path for m in all_manifests)
    manifests = [m for m in all_manifests if pruner.manifest_may_match(m)]
    scan = _read_delete_manifests(
        table, [m for m in manifests if m.content == ManifestContent.DELETES]
    )
    context.manifest_live_entries = scan.live_entries
    equality_deletes = EqualityDeleteIndex(metadata.specs(), scan.equality_deletes)
    # A global equality delete applies across partitions: which data files it reaches is known
    # only when no filter pruned any of them (then it can be retired once they are all
    # rewritten). Past max_candidate_files, candidates are left for the next run and planning
    # goes on as under a filter; besides, only the delete files already met gain targets: one
    # met first there applies to no kept candidate, so this run cannot retire it.
    filtered = not isinstance(row_filter, AlwaysTrue)
    global_targets_complete = not filtered
    budget, kept = options.max_candidate_files, 0
    # Partitions let go of to make room in the budget, and the count kept when that was done.
    evicted: set[tuple[int, PartitionKey | None]] = set()
    evicted_at = -(budget or 0)
    top_level = _top_level_ids(metadata.schema())

    # (spec id, partition key); (output spec id, None) for files moving into the output spec.
    candidates: dict[tuple[int, PartitionKey | None], list[InputFile]] = defaultdict(list)
    specs = metadata.specs()
    incomplete: set[str] = set()
    delete_targets: dict[str, set[str]] = defaultdict(set)
    delete_by_key: dict[str, DataFile] = {}
    shapes: dict[Any, Shape] = {}
    read = partial(planning_entries, metric_ids=_metric_ids(table, row_filter, plan.clustering))
    data_manifests = [m for m in manifests if m.content == ManifestContent.DATA]
    for manifest, entries in read_manifests(table, data_manifests, read):
        context.manifest_live_entries[manifest.manifest_path] = len(entries)
        for entry in entries:
            data_file = entry.data_file
            if filtered and not pruner.partition_may_match(data_file):
                continue
            seq = entry.sequence_number or INITIAL_SEQUENCE_NUMBER
            path = data_file.file_path
            dvs = [d for d_seq, d in scan.deletion_vectors.get(path, []) if d_seq >= seq]
            legacy = (
                scan.position_deletes.for_data_file(seq, data_file)
                if scan.has_position_deletes
                else set()
            )
            # A DV holds every deleted position of its file (writers merge older position
            # deletes into it), so readers ignore position delete files there, as Java does.
            deletes = sorted(dvs or legacy, key=delete_file_key)
            equality = equality_deletes.for_data_file(entry)
            # Overridden position deletes still target the file: they go once it is rewritten.
            for delete_file in [*deletes, *equality, *(legacy if dvs else ())]:
                delete_key = delete_file_key(delete_file)
                if not global_targets_complete and _applies_globally(delete_file, specs):
                    incomplete.add(delete_key)
                elif not plan.deferred_files or delete_key in delete_targets:
                    delete_targets[delete_key].add(path)
                    delete_by_key[delete_key] = delete_file
            deletes = deletes + equality
            plan.data_files_scanned += 1
            if filtered and not pruner.file_may_match(data_file):
                continue
            if exclude and (path in exclude or any(d.file_path in exclude for d in deletes)):
                plan.skipped["quarantined_files"] += 1
                continue
            size = data_file.file_size_in_bytes
            wrong_size = size < options.min_file_size or size > options.max_file_size
            moving = output_spec is not None and data_file.spec_id != output_spec
            if not (
                options.rewrite_all
                or wrong_size
                or moving
                or _too_many_deletes(path, data_file.record_count, deletes, options)
            ):
                continue
            if any(not set(d.equality_ids or ()) <= top_level for d in equality):
                plan.skipped["equality_deletes_on_columns_no_longer_in_the_schema"] += 1
                continue
            in_partition = partition_key(data_file.partition)
            group_key = (
                (output_spec, None)
                if moving and output_spec is not None
                else (data_file.spec_id, in_partition)
            )
            if budget is not None and kept >= budget and kept - 1 >= evicted_at + budget // 4:
                # Full: let go of the partitions that could not make a group worth rewriting,
                # so that they do not hold the budget run after run (at most one pass for
                # each quarter of the budget admitted since the last).
                released = _release_unworthy(candidates, evicted, options)
                kept -= released
                plan.deferred_files += released
                evicted_at = kept
            if group_key in evicted or (budget is not None and kept >= budget):
                global_targets_complete = False  # from here on, as under a filter
                plan.deferred_files += 1
                continue
            kept += 1
            candidates[group_key].append(
                PlannedFile(
                    data_file,
                    seq,
                    tuple(deletes),
                    entry.file_sequence_number,
                    manifest.manifest_path,
                    shared_shape(data_file, in_partition, shapes),
                )
            )

    if plan.deferred_files:
        log.warning(
            "table %s: planning keeps at most %d candidate files (--memory-limit); the next run "
            "takes the %d others",
            identifier,
            budget,
            plan.deferred_files,
        )
    schema = metadata.schema()
    groups: list[FileGroup] = []
    for spec_id, key in list(candidates):
        files = candidates.pop((spec_id, key))  # the groups alone hold them then
        # By path, then (stably) by sequence number: no key tuple, no str made per file.
        files.sort(key=attrgetter("path_bytes"))
        files.sort(key=attrgetter("data_sequence_number"))
        spec = specs[spec_id]
        partition = Record() if key is None else files[0].data_file.partition
        if key is None:
            path = f"(other specs into spec {spec_id})"
        else:
            path = partition_path(spec, schema, partition)
        for members in _pack(files, options.max_group_size):
            group = FileGroup(
                0,
                spec_id,
                partition,
                path,
                members,
                options.target_file_size,
                repartition=key is None,
            )
            reason = skip_reason(group, options)
            if reason:
                plan.skipped[reason] += 1
            else:
                groups.append(group)

    if plan.clustering is None:  # a sorted group is one sorted run: it is never cut
        groups = _split_for_idle_workers(groups, options)
    if grown_before:
        inputs = [(g, g.inputs) for g in groups]
        plan.grown_before = [i for _, i in inputs if i in grown_before]
        groups = [g for g, i in inputs if i not in grown_before]
        if plan.grown_before:
            plan.skipped["groups_that_grew_when_last_rewritten"] += len(plan.grown_before)
    groups.sort(key=_JOB_ORDERS[options.rewrite_job_order])
    if options.max_files_to_rewrite is not None:
        groups = _within_max_files(groups, options.max_files_to_rewrite, plan)
    for number, group in enumerate(groups):
        group.group_id = number
    plan.groups = groups
    targeted = set().union(*delete_targets.values())
    planned = {f.path for g in groups for f in g.files if f.path in targeted}
    plan.equality_delete_sequence_numbers = equality_deletes.sequence_numbers
    if global_targets_complete:  # delete files that apply to nothing go with the next commit
        for delete_file in scan.delete_files:
            delete_key = delete_file_key(delete_file)
            if delete_key not in delete_targets:
                delete_targets[delete_key] = set()
                delete_by_key[delete_key] = delete_file
    context.delete_file_targets = {
        key: (delete_by_key[key], frozenset(targets))
        for key, targets in delete_targets.items()
        if (targets & planned or not targets) and key not in incomplete
    }
    return plan, context


def _release_unworthy(
    candidates: dict[tuple[int, PartitionKey | None], list[InputFile]],
    evicted: set[tuple[int, PartitionKey | None]],
    options: PlanOptions,
) -> int:
    """Drop the partitions whose candidates would not make a group worth rewriting (too few,
    too small; files moving to the output spec always are), adding them to ``evicted``;
    returns how many candidates were dropped."""
    released = 0
    for key, files in list(candidates.items()):
        if key[1] is None:
            continue
        group = FileGroup(0, key[0], Record(), "", files, options.target_file_size)
        if skip_reason(group, options) is not None:
            del candidates[key]
            evicted.add(key)
            released += len(files)
    return released


def _split_for_idle_workers(groups: list[FileGroup], options: PlanOptions) -> list[FileGroup]:
    """Cut large groups in two while workers would otherwise idle.

    A group is one output stream on one core: a table that compacts into one group (an
    unpartitioned table, say) would leave every other core idle. While there are fewer groups
    than ``options.min_groups``, the largest group with at least two target files' worth of
    input is cut, in write order, after the whole number of target files nearest half its
    input, so that both halves still write target-size files (each half ends with a partial
    file, as every group does: a cut adds at most one). Halves that would not be worth
    rewriting on their own stay together.
    """
    workers, target = options.min_groups, options.target_file_size
    result, whole_groups = list(groups), list[FileGroup]()
    while len(result) + len(whole_groups) < workers:
        splittable = [g for g in result if g.input_bytes >= 2 * target and len(g.files) >= 2]
        if not splittable:
            break
        group = max(splittable, key=lambda g: g.input_bytes)
        result.remove(group)
        cut_at, size, half = 0, 0, max(1, round(group.input_bytes / target / 2)) * target
        while size < half:
            size += group.files[cut_at].size
            cut_at += 1
        halves = [
            replace(group, files=group.files[:cut_at]),
            replace(group, files=group.files[cut_at:]),
        ]
        if all(h.files and skip_reason(h, options) is None for h in halves):
            result.extend(halves)
        else:
            whole_groups.append(group)
    return result + whole_groups


# Spark's rewrite-job-order, ties broken by partition; the default, most files first: with
# partial progress the most fragmented partitions are committed first.
_JOB_ORDERS: dict[str, Callable[[FileGroup], tuple[Any, ...]]] = {
    "most-fragmented": lambda g: (-len(g.files), -g.input_bytes, g.partition_path),
    "bytes-asc": lambda g: (g.input_bytes, g.partition_path),
    "bytes-desc": lambda g: (-g.input_bytes, g.partition_path),
    "files-asc": lambda g: (len(g.files), g.partition_path),
    "files-desc": lambda g: (-len(g.files), g.partition_path),
}


def _within_max_files(groups: list[FileGroup], limit: int, plan: Plan) -> list[FileGroup]:
    """The groups, in job order, that fit in ``limit`` input files together (Spark's
    max-files-to-rewrite); the others are counted in the plan's ``skipped``."""
    taken: list[FileGroup] = []
    files = 0
    for group in groups:
        if files + len(group.files) <= limit:
            taken.append(group)
            files += len(group.files)
        else:
            plan.skipped["groups_beyond_max_files_to_rewrite"] += 1
    return taken


def skip_reason(group: FileGroup, options: PlanOptions) -> str | None:
    """Why a group would not help (None when it should be rewritten)."""
    if options.rewrite_all or group.repartition:
        return None
    too_large = any(f.size > options.max_file_size for f in group.files)
    has_deletes = any(
        _too_many_deletes(f.path, f.record_count, f.delete_files, options) for f in group.files
    )
    if too_large or has_deletes:
        return None
    count = len(group.files)
    if group.expected_output_files >= count:
        return "groups_not_reducing_file_count"
    enough_files = count >= options.min_input_files
    enough_content = group.input_bytes >= options.target_file_size
    if not (enough_files or enough_content):
        return "groups_below_min_input_files"
    return None
