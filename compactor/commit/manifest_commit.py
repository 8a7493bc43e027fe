"""Write a group's manifests anew, clustered by partition, and commit them as one ``replace``.

Iceberg Java's ``RewriteManifests`` (what Spark's ``rewrite_manifests`` commits): the new
manifests list the same live files as the manifests they replace, each entry as EXISTING with
its snapshot id, data sequence number and file sequence number (and, format 3, its
``first_row_id``) unchanged; no data or delete file is added or removed, so the snapshot's totals
stay as they were. The head's other manifests are carried over by reference, among them every
manifest committed since the start (a concurrent append's).

A group is committed only while every manifest it replaces is still in the head's manifest
list: manifests are immutable, so the entries it read are then exactly the live ones. A
concurrent commit that deleted or replaced an entry of one of them had to write that manifest
anew: the group is refused (:func:`find_manifest_conflicts`) and left for the next run, never
an entry lost or resurrected. Catalog conflicts are retried as every commit is
(:func:`~compactor.commit.committer.commit_groups`), validating again each time; only the
manifest list is rewritten per attempt.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.io import InputFile, OutputFile, OutputStream
from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import Snapshot

from compactor.commit.committer import (
    CommitJournal,
    CommitOutcome,
    commit_groups,
    replace_snapshot,
)
from compactor.commit.retry import RetryPolicy
from compactor.commit.snapshot_writer import SnapshotWriter
from compactor.commit.validation import new_snapshots
from compactor.errors import CommitConflictError
from compactor.iceberg.pyiceberg_compat import manifest_writer, snapshot_manifests
from compactor.planning.manifest_groups import ManifestGroup, ManifestPlan, split_evenly

# Entries written in memory to measure what one costs in a manifest of the table's codec.
SAMPLE_ENTRIES = 1000
# Iceberg Java's summary properties of a manifest rewrite (SnapshotSummary).
CREATED_MANIFESTS = "manifests-created"
KEPT_MANIFESTS = "manifests-kept"
REPLACED_MANIFESTS = "manifests-replaced"
PROCESSED_ENTRIES = "entries-processed"


@dataclass(frozen=True)
class RewrittenManifests:
    """A group as its rewrite left it: the live entries read, and the manifests written (in a
    dry run, none: ``planned`` says how many would be)."""

    group: ManifestGroup
    entries: int
    planned: int
    outputs: tuple[ManifestFile, ...] = ()

    @property
    def group_id(self) -> int:
        return self.group.group_id

    @property
    def bytes_written(self) -> int:
        return sum(m.manifest_length for m in self.outputs)

    def summary(self) -> dict[str, Any]:
        group = self.group
        return {
            "group_id": group.group_id,
            "content": group.content_name,
            "spec_id": group.spec_id,
            "manifests_before": len(group.manifests),
            "manifests_after": self.planned,
            "entries": self.entries,
            "bytes_before": group.bytes,
            "bytes_after": self.bytes_written,
            "reasons": list(group.reasons),
        }


class _MemoryOutput(OutputFile):
    """An output file in memory: a manifest written to be measured, not kept."""

    def __init__(self) -> None:
        super().__init__("memory:manifest-size-sample.avro")
        self.data = b""

    def __len__(self) -> int:
        return len(self.data)

    def exists(self) -> bool:
        return bool(self.data)

    def to_input_file(self) -> InputFile:
        raise NotImplementedError("a size sample is never read back")

    def create(self, overwrite: bool = False) -> OutputStream:
        output = self

        class _Buffer(io.BytesIO):
            def close(self) -> None:
                output.data = self.getvalue()
                super().close()

        return _Buffer()


def _existing(entry: ManifestEntry) -> ManifestEntry:
    """``entry`` as an EXISTING entry: snapshot id and sequence numbers kept."""
    return ManifestEntry.from_args(
        status=ManifestEntryStatus.EXISTING,
        snapshot_id=entry.snapshot_id,
        sequence_number=entry.sequence_number,
        file_sequence_number=entry.file_sequence_number,
        data_file=entry.data_file,
    )


def _sample_length(table: Table, group: ManifestGroup, entries: Sequence[ManifestEntry]) -> int:
    metadata = table.metadata
    output = _MemoryOutput()
    compression = metadata.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    with manifest_writer(
        group.content,
        metadata.format_version,
        metadata.specs()[group.spec_id],
        metadata.schema(),
        output,
        entries[0].snapshot_id or 0,
        compression,
    ) as writer:
        for entry in entries:
            writer.add_entry(_existing(entry))
    return len(output)


def manifest_count(
    table: Table, group: ManifestGroup, entries: Sequence[ManifestEntry], target_size: int
) -> int:
    """How many manifests of about ``target_size`` hold ``entries`` (clustered, in order).

    Measured: one entry, then a run of up to SAMPLE_ENTRIES consecutive entries from the
    middle, are written in memory with the table's codec; their difference is what an entry
    costs, the rest what a manifest costs on its own (its header: the schema and the spec).
    """
    if len(entries) <= 1:
        return len(entries)
    middle = len(entries) // 2
    sample = entries[max(0, middle - SAMPLE_ENTRIES // 2) :][:SAMPLE_ENTRIES]
    one = _sample_length(table, group, sample[:1])
    per_entry = max(1.0, (_sample_length(table, group, sample) - one) / (len(sample) - 1))
    header = max(0.0, one - per_entry)
    capacity = max(1, int((target_size - header) // per_entry))
    return math.ceil(len(entries) / capacity)


def write_manifests(
    writer: SnapshotWriter, group: ManifestGroup, entries: Sequence[ManifestEntry], count: int
) -> list[ManifestFile]:
    """Write ``entries`` (clustered) into ``count`` manifests of consecutive runs."""
    manifests, start = [], 0
    for size in split_evenly(len(entries), count):
        with writer.manifest_writer(group.spec_id, group.content) as out:
            for entry in entries[start : start + size]:
                out.add_entry(_existing(entry))
        manifests.append(out.to_manifest_file())
        start += size
    return manifests


def find_manifest_conflicts(
    table: Table,
    start_snapshot_id: int | None,
    groups: Iterable[RewrittenManifests],
    head: Snapshot | None,
    branch: str,
) -> dict[int, str]:
    """Group id -> why committing it now would be wrong: a manifest it replaces is no longer
    in the head's manifest list (a concurrent commit deleted, replaced or moved an entry of it)."""
    groups = list(groups)
    if head is None or head.snapshot_id == start_snapshot_id or not groups:
        return {}
    version = table.metadata.format_version
    live = {m.manifest_path for m in snapshot_manifests(table.io, head, version)}
    gone = {g.group_id: sorted(g.group.paths - live) for g in groups}
    if not any(gone.values()):
        return {}
    # Name the snapshot that dropped each: the oldest whose manifest list lacks it.
    history = [
        (s.snapshot_id, {m.manifest_path for m in snapshot_manifests(table.io, s, version)})
        for s in reversed(new_snapshots(table, start_snapshot_id, head, branch))
    ]
    conflicts = {}
    for group_id, paths in gone.items():
        if not paths:
            continue
        path = paths[0]
        by = next((sid for sid, listed in history if path not in listed), head.snapshot_id)
        conflicts[group_id] = f"manifest {path} was replaced by snapshot {by}"
    return conflicts


def commit_manifest_rewrite(
    table: Table,
    identifier: str,
    plan: ManifestPlan,
    groups: list[RewrittenManifests],
    snapshot_id: int,
    snapshot_properties: dict[str, str],
    *,
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    journal: CommitJournal | None = None,
    branch: str = "main",
) -> CommitOutcome[RewrittenManifests]:
    """Commit the rewritten ``groups`` (their manifests written for ``snapshot_id``) as one
    ``replace`` snapshot; groups a concurrent commit touched are refused and reported.

    The caller owns the manifests of refused groups. Raises :class:`CommitStateUnknownError`
    when the catalog cannot tell whether the commit landed, :class:`CommitConflictError` when
    the table's format version changed meanwhile or the retries are spent.
    """
    version = table.metadata.format_version

    def validate(
        head: Snapshot | None, pending: Mapping[int, RewrittenManifests]
    ) -> dict[int, str]:
        if table.metadata.format_version != version:
            raise CommitConflictError(
                f"table {identifier}: upgraded to format version "
                f"{table.metadata.format_version} during the rewrite; nothing committed"
            )
        if head is None:
            raise CommitConflictError(f"table {identifier}: {branch} has no snapshot any more")
        return find_manifest_conflicts(table, plan.snapshot_id, pending.values(), head, branch)

    def build(
        attempt: SnapshotWriter,
        head: Snapshot,
        pending: dict[int, RewrittenManifests],
        outcome: CommitOutcome[RewrittenManifests],
    ) -> Snapshot | None:
        replaced = {path for g in pending.values() for path in g.group.paths}
        current = snapshot_manifests(table.io, head, table.metadata.format_version)
        kept = [m for m in current if m.manifest_path not in replaced]
        created = [m for g in pending.values() for m in g.outputs]
        properties = {
            **snapshot_properties,
            CREATED_MANIFESTS: str(len(created)),
            KEPT_MANIFESTS: str(len(kept)),
            REPLACED_MANIFESTS: str(len(replaced)),
            PROCESSED_ENTRIES: str(sum(g.entries for g in pending.values())),
        }
        return replace_snapshot(attempt, head, created + kept, None, properties)

    return commit_groups(
        table,
        identifier,
        {g.group_id: g for g in groups},
        validate,
        lambda g: (),
        build,
        retry=retry,
        sleep=sleep,
        journal=journal,
        branch=branch,
        snapshot_id=snapshot_id,
    )
