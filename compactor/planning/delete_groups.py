"""Plan a position-delete rewrite: a branch head's position delete files by partition.

:func:`plan_delete_rewrite` reads the head's manifests once and returns a
:class:`DeletePlan`: one :class:`DeleteGroup` per (spec id, partition) holding Parquet position
delete files (deletion vectors are never grouped) that a row filter may touch, and the live data
files, which the rewrite needs to tell the rows that still apply from the dangling ones.
Iceberg Java's ``RewritePositionDeleteFiles`` planner, beside :mod:`compactor.planning.planner`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pyiceberg.expressions import BooleanExpression
from pyiceberg.manifest import (
    INITIAL_SEQUENCE_NUMBER,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
)
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record

from compactor.iceberg.pyiceberg_compat import FilePruner, snapshot_manifests
from compactor.iceberg.value_keys import PartitionKey, partition_key
from compactor.planning.health import delete_file_kinds
from compactor.planning.planner import branch_head, partition_path, read_manifests

# Live data files by path: (data sequence number, spec id, partition) of each.
LiveData = Mapping[str, list[tuple[int, int, Record]]]


def sequence_number(entry: ManifestEntry) -> int:
    """The entry's data sequence number (inherited ones included)."""
    return entry.sequence_number or INITIAL_SEQUENCE_NUMBER


def is_parquet_position_delete(delete_file: DataFile) -> bool:
    """Whether ``delete_file`` is a position delete file in Parquet (not a deletion vector)."""
    return (
        delete_file.content == DataFileContent.POSITION_DELETES
        and delete_file.file_format == FileFormat.PARQUET
        and getattr(delete_file, "content_offset", None) is None
    )


@dataclass(frozen=True)
class DeleteGroup:
    """The live position delete files of one (spec, partition), rewritten together."""

    group_id: int
    spec_id: int
    partition: Record
    partition_path: str
    entries: tuple[ManifestEntry, ...]
    # The start snapshot's manifests that list ``entries``.
    manifests: frozenset[str] = frozenset()

    @property
    def delete_files(self) -> list[DataFile]:
        return [e.data_file for e in self.entries]

    @property
    def paths(self) -> set[str]:
        return {e.data_file.file_path for e in self.entries}

    @property
    def input_bytes(self) -> int:
        return sum(d.file_size_in_bytes for d in self.delete_files)

    @property
    def data_sequence_number(self) -> int:
        """The largest data sequence number of the replaced files: the new files get it."""
        return max(sequence_number(e) for e in self.entries)


@dataclass(frozen=True)
class RewrittenDeleteGroup(DeleteGroup):
    """A group as its rewrite left it: what it read, kept and wrote, or why it was left alone."""

    rows_read: int = 0
    dangling_rows: int = 0
    duplicate_rows: int = 0
    rows_written: int = 0
    # Data files (paths) the kept rows apply to, and every path any row names.
    target_paths: frozenset[str] = frozenset()
    referenced_paths: frozenset[str] = frozenset()
    outputs: tuple[DataFile, ...] = ()
    skipped: str | None = None

    @classmethod
    def of(cls, group: DeleteGroup, **found: Any) -> RewrittenDeleteGroup:
        """``group`` with what its rewrite ``found`` (this class's own fields)."""
        return cls(**{f.name: getattr(group, f.name) for f in fields(DeleteGroup)}, **found)

    def expected_output_files(self, target_file_size: int) -> int:
        """Files the rewrite writes (or, not written yet, would: sized by the inputs' bytes)."""
        if self.outputs or not self.rows_written:
            return len(self.outputs)
        estimate = self.input_bytes * self.rows_written / max(self.rows_read, 1)
        return max(1, math.ceil(estimate / target_file_size))

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


@dataclass(frozen=True)
class DeletePlan:
    """What a delete rewrite starts from: a branch head, its groups, and its live data files."""

    snapshot_id: int | None = None
    branch: str = MAIN_BRANCH
    start_manifests: frozenset[str] = frozenset()
    live: LiveData = field(default_factory=dict)
    groups: tuple[DeleteGroup, ...] = ()
    # Live delete files of the snapshot by kind (position, equality, deletion_vector).
    delete_files: Mapping[str, int] = field(default_factory=dict)


def plan_delete_rewrite(
    table: Table, identifier: str, row_filter: BooleanExpression, branch: str = MAIN_BRANCH
) -> DeletePlan:
    """The Parquet position delete files of ``branch``'s head by (spec, partition), the
    partitions ``row_filter`` may touch only; groups with the most files first."""
    snapshot = branch_head(table, identifier, branch)
    if snapshot is None:
        return DeletePlan(branch=branch)
    metadata = table.metadata
    manifests = snapshot_manifests(table.io, snapshot, metadata.format_version)
    pruner = FilePruner(metadata, row_filter)
    live: defaultdict[str, list[tuple[int, int, Record]]] = defaultdict(list)
    candidates: dict[tuple[int, PartitionKey], list[tuple[str, ManifestEntry]]] = defaultdict(list)
    deletes = []
    for manifest, entries in read_manifests(table, manifests):
        for entry in entries:
            data_file = entry.data_file
            if data_file.content == DataFileContent.DATA:
                live[data_file.file_path].append(
                    (sequence_number(entry), data_file.spec_id, data_file.partition)
                )
                continue
            deletes.append(data_file)
            if is_parquet_position_delete(data_file) and pruner.partition_may_match(data_file):
                key = (data_file.spec_id, partition_key(data_file.partition))
                candidates[key].append((manifest.manifest_path, entry))
    specs, schema = metadata.specs(), metadata.schema()
    groups = []
    for (spec_id, _), found in candidates.items():
        partition = found[0][1].data_file.partition
        found.sort(key=lambda item: (sequence_number(item[1]), item[1].data_file.file_path))
        groups.append(
            DeleteGroup(
                group_id=0,
                spec_id=spec_id,
                partition=partition,
                partition_path=partition_path(specs[spec_id], schema, partition),
                entries=tuple(e for _, e in found),
                manifests=frozenset(m for m, _ in found),
            )
        )
    groups.sort(key=lambda g: (-len(g.entries), g.spec_id, g.partition_path))
    return DeletePlan(
        snapshot_id=snapshot.snapshot_id,
        branch=branch,
        start_manifests=frozenset(m.manifest_path for m in manifests),
        live=live,
        groups=tuple(replace(g, group_id=n) for n, g in enumerate(groups)),
        delete_files=delete_file_kinds(deletes),
    )


def count_delete_files(table: Table, snapshot: Snapshot | None) -> dict[str, int]:
    """The live delete files of ``snapshot`` (none: no snapshot) by kind."""
    if snapshot is None:
        return delete_file_kinds([])
    manifests = snapshot_manifests(table.io, snapshot, table.metadata.format_version)
    deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
    return delete_file_kinds(
        e.data_file for _, found in read_manifests(table, deletes) for e in found
    )
