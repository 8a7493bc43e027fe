"""Describe a table's file layout: how fragmented it is, per table and per partition."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table

from compactor.settings import MIN_FILE_SIZE_RATIO


@dataclass
class PartitionHealth:
    partition: str
    data_files: int = 0
    data_bytes: int = 0
    small_files: int = 0
    records: int = 0


@dataclass
class TableHealth:
    """File counts and sizes of a table's current snapshot."""

    table: str
    snapshot_id: int | None
    target_file_size: int
    data_files: int = 0
    data_bytes: int = 0
    records: int = 0
    small_files: int = 0
    small_bytes: int = 0
    position_delete_files: int = 0
    equality_delete_files: int = 0
    snapshots: int = 0
    partitions: dict[str, PartitionHealth] = field(default_factory=dict)

    @property
    def average_file_size(self) -> float:
        return self.data_bytes / self.data_files if self.data_files else 0.0

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        worst = sorted(self.partitions.values(), key=lambda p: (-p.small_files, p.partition))[:top]
        return {
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "snapshots": self.snapshots,
            "target_file_size": self.target_file_size,
            "data_files": self.data_files,
            "data_bytes": self.data_bytes,
            "records": self.records,
            "average_file_size": round(self.average_file_size),
            "small_files": self.small_files,
            "small_bytes": self.small_bytes,
            "position_delete_files": self.position_delete_files,
            "equality_delete_files": self.equality_delete_files,
            "partitions": len(self.partitions),
            "worst_partitions": [vars(p) for p in worst],
        }


def table_health(table: Table, identifier: str, target_file_size: int) -> TableHealth:
    """Read the current snapshot's manifests and summarise file sizes against the target."""
    snapshot = table.current_snapshot()
    health = TableHealth(identifier, snapshot.snapshot_id if snapshot else None, target_file_size)
    health.snapshots = len(table.metadata.snapshots)
    if snapshot is None:
        return health
    small = target_file_size * MIN_FILE_SIZE_RATIO
    specs, schema = table.metadata.specs(), table.schema()
    partitions: dict[str, PartitionHealth] = defaultdict(lambda: PartitionHealth(""))
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            if data_file.content == DataFileContent.POSITION_DELETES:
                health.position_delete_files += 1
                continue
            if data_file.content == DataFileContent.EQUALITY_DELETES:
                health.equality_delete_files += 1
                continue
            spec = specs[data_file.spec_id]
            name = (
                spec.partition_to_path(data_file.partition, schema)
                if not spec.is_unpartitioned()
                else ""
            )
            part = partitions[name]
            part.partition = name or "(unpartitioned)"
            size = data_file.file_size_in_bytes
            health.data_files += 1
            health.data_bytes += size
            health.records += data_file.record_count
            part.data_files += 1
            part.data_bytes += size
            part.records += data_file.record_count
            if size < small:
                health.small_files += 1
                health.small_bytes += size
                part.small_files += 1
    health.partitions = dict(partitions)
    return health
