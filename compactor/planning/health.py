"""Describe a table's file layout: how fragmented it is, per table and per partition."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestFile
from pyiceberg.table import Table

from compactor.iceberg.pyiceberg_compat import manifest_entries
from compactor.options.defaults import DEFAULT_MIN_INPUT_FILES, MIN_FILE_SIZE_RATIO
from compactor.planning.planner import is_unpartitioned

DELETE_KINDS = ("position", "equality", "deletion_vector")
WORST_PARTITIONS = 10  # partitions `inspect` lists, the most files under target first


def delete_kind(delete_file: DataFile) -> str:
    """``position``, ``equality`` or ``deletion_vector`` (a position delete in a Puffin file)."""
    if delete_file.content == DataFileContent.EQUALITY_DELETES:
        return "equality"
    return "deletion_vector" if delete_file.file_format == FileFormat.PUFFIN else "position"


def delete_file_kinds(delete_files: Iterable[DataFile]) -> dict[str, int]:
    """How many of ``delete_files`` are of each kind."""
    counts = dict.fromkeys(DELETE_KINDS, 0)
    for delete_file in delete_files:
        counts[delete_kind(delete_file)] += 1
    return counts


@dataclass
class PartitionHealth:
    partition: str
    data_files: int = 0
    data_bytes: int = 0
    files_under_target: int = 0
    bytes_under_target: int = 0
    records: int = 0

    def add(self, other: PartitionHealth) -> None:
        self.data_files += other.data_files
        self.data_bytes += other.data_bytes
        self.files_under_target += other.files_under_target
        self.bytes_under_target += other.bytes_under_target
        self.records += other.records

    def small(self, min_input_files: int) -> tuple[int, int]:
        """Files and bytes a compaction would rewrite here: the files under the small-file
        threshold, when there are at least ``min_input_files`` (and two) of them to merge."""
        if self.files_under_target >= max(min_input_files, 2):
            return self.files_under_target, self.bytes_under_target
        return 0, 0


@dataclass
class PartitionDeletes:
    """The delete files of one partition: equality deletes and Parquet position deletes."""

    equality_delete_files: int = 0
    position_delete_files: int = 0  # deletion vectors are counted per table only

    def add(self, other: PartitionDeletes) -> None:
        self.equality_delete_files += other.equality_delete_files
        self.position_delete_files += other.position_delete_files


@dataclass
class FileCounts:
    """File counts and sizes of some manifests: one manifest's, or a whole snapshot's."""

    data_files: int = 0
    data_bytes: int = 0
    records: int = 0
    files_under_target: int = 0
    bytes_under_target: int = 0
    position_delete_files: int = 0
    equality_delete_files: int = 0
    deletion_vectors: int = 0
    partitions: dict[str, PartitionHealth] = field(default_factory=dict)
    # Per partition holding equality or position delete files (a global delete's is the
    # partition of its unpartitioned spec).
    partition_deletes: dict[str, PartitionDeletes] = field(default_factory=dict)

    def add(self, other: FileCounts) -> None:
        """Add ``other``'s counts to these."""
        self.data_files += other.data_files
        self.data_bytes += other.data_bytes
        self.records += other.records
        self.files_under_target += other.files_under_target
        self.bytes_under_target += other.bytes_under_target
        self.position_delete_files += other.position_delete_files
        self.equality_delete_files += other.equality_delete_files
        self.deletion_vectors += other.deletion_vectors
        for name, part in other.partitions.items():
            self.partitions.setdefault(name, PartitionHealth(name)).add(part)
        for name, deletes in other.partition_deletes.items():
            self.partition_deletes.setdefault(name, PartitionDeletes()).add(deletes)


@dataclass
class TableHealth(FileCounts):
    """File counts and sizes of a table's current snapshot."""

    table: str = ""
    snapshot_id: int | None = None
    target_file_size: int = 0
    min_input_files: int = DEFAULT_MIN_INPUT_FILES
    snapshots: int = 0

    @property
    def average_file_size(self) -> float:
        return self.data_bytes / self.data_files if self.data_files else 0.0

    @property
    def delete_files(self) -> int:
        return self.position_delete_files + self.equality_delete_files + self.deletion_vectors

    @property
    def small_files(self) -> int:
        """Files a compaction would rewrite now: see :meth:`PartitionHealth.small`."""
        return sum(p.small(self.min_input_files)[0] for p in self.partitions.values())

    @property
    def small_bytes(self) -> int:
        return sum(p.small(self.min_input_files)[1] for p in self.partitions.values())

    def worst_partitions(self, top: int = WORST_PARTITIONS) -> list[PartitionHealth]:
        ranked = sorted(
            self.partitions.values(), key=lambda p: (-p.files_under_target, p.partition)
        )
        return ranked[:top]

    def to_dict(self, top: int = WORST_PARTITIONS) -> dict[str, Any]:
        return {
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "snapshots": self.snapshots,
            "target_file_size": self.target_file_size,
            "min_input_files": self.min_input_files,
            "data_files": self.data_files,
            "data_bytes": self.data_bytes,
            "records": self.records,
            "average_file_size": round(self.average_file_size),
            "small_files": self.small_files,
            "small_bytes": self.small_bytes,
            "files_under_target": self.files_under_target,
            "bytes_under_target": self.bytes_under_target,
            "position_delete_files": self.position_delete_files,
            "equality_delete_files": self.equality_delete_files,
            "deletion_vectors": self.deletion_vectors,
            "partitions": len(self.partitions),
            "worst_partitions": [self._partition(p) for p in self.worst_partitions(top)],
        }

    def _partition(self, part: PartitionHealth) -> dict[str, Any]:
        small_files, small_bytes = part.small(self.min_input_files)
        return {**vars(part), "small_files": small_files, "small_bytes": small_bytes}


class ManifestCache:
    """Counts per manifest file, so that a rescan reads only manifests it has not seen.

    Manifest files are immutable, so counts keyed by path (and the small-file threshold) never
    go stale; :func:`table_health` keeps only the entries of the snapshot it last read.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], FileCounts] = {}
        self.manifests_read = 0

    def counts(self, table: Table, manifest: ManifestFile, small: int) -> FileCounts:
        key = (manifest.manifest_path, small)
        if key not in self._counts:
            self._counts[key] = _manifest_counts(table, manifest, small)
            self.manifests_read += 1
        return self._counts[key]

    def retain(self, keys: set[tuple[str, int]]) -> None:
        self._counts = {key: value for key, value in self._counts.items() if key in keys}


def _manifest_counts(table: Table, manifest: ManifestFile, small: int) -> FileCounts:
    counts = FileCounts()
    specs, schema = table.metadata.specs(), table.schema()
    for entry in manifest_entries(table.io, manifest, table.metadata.format_version):
        data_file = entry.data_file
        spec = specs[data_file.spec_id]
        name = (
            spec.partition_to_path(data_file.partition, schema)
            if not is_unpartitioned(spec)
            else ""
        ) or "(unpartitioned)"
        if data_file.content != DataFileContent.DATA:
            kind = delete_kind(data_file)
            if kind == "deletion_vector":
                counts.deletion_vectors += 1
                continue
            deletes = counts.partition_deletes.setdefault(name, PartitionDeletes())
            if kind == "position":
                counts.position_delete_files += 1
                deletes.position_delete_files += 1
            else:
                counts.equality_delete_files += 1
                deletes.equality_delete_files += 1
            continue
        part = counts.partitions.setdefault(name, PartitionHealth(name))
        size = data_file.file_size_in_bytes
        counts.data_files += 1
        counts.data_bytes += size
        counts.records += data_file.record_count
        part.data_files += 1
        part.data_bytes += size
        part.records += data_file.record_count
        if size < small:
            counts.files_under_target += 1
            counts.bytes_under_target += size
            part.files_under_target += 1
            part.bytes_under_target += size
    return counts


def table_health(
    table: Table,
    identifier: str,
    target_file_size: int,
    min_input_files: int = DEFAULT_MIN_INPUT_FILES,
    cache: ManifestCache | None = None,
) -> TableHealth:
    """Summarise the current snapshot's files against the target, reading its manifests.

    Small files are those a compaction would rewrite: under 75% of the target, in partitions
    holding ``min_input_files`` of them. With ``cache``, manifests read by an earlier call are
    not read again.
    """
    snapshot = table.current_snapshot()
    health = TableHealth(
        table=identifier,
        snapshot_id=snapshot.snapshot_id if snapshot else None,
        target_file_size=target_file_size,
        min_input_files=min_input_files,
        snapshots=len(table.metadata.snapshots),
    )
    if snapshot is None:
        return health
    small = int(target_file_size * MIN_FILE_SIZE_RATIO)
    cache = cache or ManifestCache()
    manifests = snapshot.manifests(table.io)
    for manifest in manifests:
        health.add(cache.counts(table, manifest, small))
    cache.retain({(m.manifest_path, small) for m in manifests})
    return health
