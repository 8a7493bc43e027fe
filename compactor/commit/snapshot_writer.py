"""Writing one snapshot's manifests and manifest list, and moving a branch to it.

:class:`SnapshotWriter` names each file (and tells a journal of it) before writing it, so a
commit that does not land can be discarded to the last file; :func:`carry_over` keeps a
manifest or rewrites it without some entries; :func:`branch_commit` is the catalog commit that
adds a snapshot and moves a branch to it, keeping the branch's own retention as Iceberg Java
does. Every snapshot compactor writes goes through these.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from contextlib import ExitStack

from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)

from compactor.iceberg.pyiceberg_compat import (
    delete_file_key,
    iter_manifest_entries,
    manifest_writer,
    write_manifest_list,
)
from compactor.storage.deleter import delete_files

# Summary properties of every snapshot compactor commits: its version, the run that committed
# it, and what it did when that was not a compaction.
SNAPSHOT_PROPERTY_TOOL = "compactor.version"
SNAPSHOT_PROPERTY_RUN_ID = "compactor.run-id"
SNAPSHOT_PROPERTY_ACTION = "compactor.action"


class SnapshotWriter:
    """The manifests and the manifest list of one snapshot, each file recorded before it is written."""

    def __init__(
        self, table: Table, snapshot_id: int, on_file: Callable[[list[str]], None] | None
    ) -> None:
        self.table = table
        self.snapshot_id = snapshot_id
        self._on_file = on_file
        self.commit_uuid = uuid.uuid4()
        self.written: list[str] = []
        self._locations = table.location_provider()
        self._compression = table.metadata.properties.get(
            TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
        )

    def _output(self, name: str) -> OutputFile:
        path = self._locations.new_metadata_location(name)
        if self._on_file:
            self._on_file([path])
        self.written.append(path)
        return self.table.io.new_output(path)

    def manifest_writer(
        self, spec_id: int, content: ManifestContent = ManifestContent.DATA
    ) -> ManifestWriter:
        metadata = self.table.metadata
        name = f"{self.commit_uuid}-m{len(self.written)}.avro"
        return manifest_writer(
            content,
            metadata.format_version,
            metadata.specs()[spec_id],
            metadata.schema(),
            self._output(name),
            self.snapshot_id,
            self._compression,
        )

    def manifest_list(
        self, parent_id: int | None, sequence_number: int, manifests: list[ManifestFile]
    ) -> tuple[str, dict[str, int]]:
        """Write the manifest list; returns its location and the snapshot's row-lineage fields."""
        name = f"snap-{self.snapshot_id}-1-{self.commit_uuid}.avro"
        output = self._output(name)
        lineage = write_manifest_list(
            self.table.metadata,
            output,
            self.snapshot_id,
            parent_id,
            sequence_number,
            self._compression,
            manifests,
        )
        return output.location, lineage

    def discard(self) -> None:
        delete_files(self.table.io, self.written)


def carry_over(
    attempt: SnapshotWriter,
    manifest: ManifestFile,
    remove: Collection[str],
    removed: Callable[[str, ManifestEntry], None],
) -> ManifestFile | None:
    """``manifest`` without the live entries whose keys are in ``remove`` (each passed to
    ``removed`` with its key).

    Keys are paths, and for deletion vectors path and blob offset (:func:`delete_file_key`).
    The manifest itself when it holds none of them, None when nothing else is left, otherwise a
    new manifest with the other entries as EXISTING (sequence numbers kept). Entries are read
    one at a time: only those before the first removed one are held (a manifest an earlier
    rewrite wrote can hold a hundred thousand).
    """
    table = attempt.table
    version = table.metadata.format_version
    held: list[ManifestEntry] = []  # kept, before the first entry removed
    any_removed = False
    with ExitStack() as writing:
        writer: ManifestWriter | None = None
        for entry in iter_manifest_entries(table.io, manifest, version):
            key = delete_file_key(entry.data_file)
            if key in remove:
                removed(key, entry)
                any_removed = True
            elif not any_removed:
                held.append(entry)
            else:
                if writer is None:
                    writer = writing.enter_context(
                        attempt.manifest_writer(manifest.partition_spec_id, manifest.content)
                    )
                    add_existing(writer, held)
                    held = []
                add_existing(writer, [entry])
        if not any_removed:
            return manifest
        if writer is None:
            if not held:
                return None
            writer = writing.enter_context(
                attempt.manifest_writer(manifest.partition_spec_id, manifest.content)
            )
            add_existing(writer, held)
    return writer.to_manifest_file()


def add_existing(writer: ManifestWriter, entries: list[ManifestEntry]) -> None:
    """Add ``entries`` to ``writer`` as EXISTING, their snapshot and sequence numbers kept."""
    for entry in entries:
        writer.add_entry(
            ManifestEntry.from_args(
                status=ManifestEntryStatus.EXISTING,
                snapshot_id=entry.snapshot_id,
                sequence_number=entry.sequence_number,
                file_sequence_number=entry.file_sequence_number,
                data_file=entry.data_file,
            )
        )


def branch_commit(
    metadata: TableMetadata, branch: str, head_id: int | None, snapshots: list[Snapshot]
) -> tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]]:
    """The requirements and updates that add ``snapshots`` (each the parent of the next) over
    ``head_id`` and move ``branch`` to the last, keeping the branch's own retention."""
    ref = metadata.refs.get(branch)
    requirements = (
        AssertTableUUID(uuid=metadata.table_uuid),
        AssertRefSnapshotId(ref=branch, snapshot_id=head_id),
    )
    updates: list[TableUpdate] = []
    for snapshot in snapshots:
        updates += [
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(
                ref_name=branch,
                type=SnapshotRefType.BRANCH,
                snapshot_id=snapshot.snapshot_id,
                max_ref_age_ms=ref.max_ref_age_ms if ref else None,
                max_snapshot_age_ms=ref.max_snapshot_age_ms if ref else None,
                min_snapshots_to_keep=ref.min_snapshots_to_keep if ref else None,
            ),
        ]
    return requirements, tuple(updates)
