"""What changed since a run's start snapshot, for the checks every commit makes first.

The history walk (:func:`new_snapshots`), the entries each new snapshot added or removed
(:func:`entries_added_by`), and the outputs no longer in storage (:func:`missing_outputs`). The
conflict rules of each kind of rewrite are built on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pyiceberg.manifest import DataFile, ManifestEntry
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from compactor.errors import CommitConflictError
from compactor.iceberg.pyiceberg_compat import manifest_entries, snapshot_manifests


def new_snapshots(
    table: Table, start_id: int | None, head: Snapshot | None, branch: str
) -> list[Snapshot]:
    """Snapshots on ``branch`` (whose head is ``head``) committed after ``start_id``, newest first."""
    found: list[Snapshot] = []
    snapshot = head
    while snapshot is not None and snapshot.snapshot_id != start_id:
        found.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None
    if start_id is not None and snapshot is None:
        raise CommitConflictError(
            f"the start snapshot {start_id} is no longer an ancestor of branch {branch} "
            "(rolled back?)"
        )
    return found


def entries_added_by(table: Table, snapshot: Snapshot) -> Iterable[ManifestEntry]:
    """The entries ``snapshot`` itself wrote (added or deleted)."""
    version = table.metadata.format_version
    for manifest in snapshot_manifests(table.io, snapshot, version):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest_entries(table.io, manifest, version, discard_deleted=False):
            if entry.snapshot_id == snapshot.snapshot_id:
                yield entry


def missing_outputs(table: Table, outputs: Mapping[int, Iterable[DataFile]]) -> dict[int, str]:
    """Groups (by id) with an output file no longer in storage, e.g. removed by another run."""
    missing: dict[int, str] = {}
    for group_id, files in outputs.items():
        for data_file in files:
            if not table.io.new_input(data_file.file_path).exists():
                missing[group_id] = (
                    f"output {data_file.file_path} is missing from storage; not committing it"
                )
                break
    return missing
