"""Commit rewritten position delete groups as one ``replace`` snapshot on a branch.

The replaced files' DELETED entries and the new files go in delete manifests; the head's other
manifests are carried over. The new files carry, explicitly on their manifest entries, the
largest data sequence number of the files they replace: every kept row's data file has a
sequence number <= its own delete's <= that maximum, so it still applies to exactly the rows it
did. Validated per group against every snapshot committed since the start
(:func:`find_delete_conflicts`) and committed through :func:`~compactor.commit.committer.commit_groups`,
as a data rewrite is: retried on conflict, refused groups reported.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from pyiceberg.manifest import (
    DataFileContent,
    ManifestContent,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot

from compactor.commit.change_manifests import ChangeManifests
from compactor.commit.committer import (
    CommitJournal,
    CommitOutcome,
    commit_groups,
    refuse_vanished,
    replace_snapshot,
)
from compactor.commit.retry import RetryPolicy
from compactor.commit.snapshot_writer import SnapshotWriter, carry_over
from compactor.commit.validation import entries_added_by, new_snapshots
from compactor.errors import CommitConflictError
from compactor.iceberg.pyiceberg_compat import snapshot_manifests
from compactor.planning.delete_groups import RewrittenDeleteGroup

DeleteCommitOutcome = CommitOutcome[RewrittenDeleteGroup]


def find_delete_conflicts(
    table: Table,
    start_snapshot_id: int | None,
    groups: Iterable[RewrittenDeleteGroup],
    head: Snapshot | None,
    branch: str = MAIN_BRANCH,
) -> dict[int, str]:
    """Group id -> why committing it now would be wrong, from every snapshot committed on
    ``branch`` since the start.

    A group is refused when one of its delete files is no longer live, a data file one of its
    kept rows applies to was removed, or a data file was added at a path one of its rows names.
    """
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
    for snapshot in new_snapshots(table, start_snapshot_id, head, branch):
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
    groups: list[RewrittenDeleteGroup],
    snapshot_properties: dict[str, str],
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    journal: CommitJournal | None = None,
    branch: str = MAIN_BRANCH,
) -> DeleteCommitOutcome:
    """Commit the rewritten ``groups`` as one ``replace`` snapshot on ``branch``; refused groups
    are reported.

    The caller owns the outputs of refused groups and deletes them. ``journal`` records files
    and catalog calls first (:func:`compactor.commit.committer.commit_on_branch`). Raises
    :class:`CommitStateUnknownError` when the catalog cannot tell whether the commit landed.
    """

    def validate(
        head: Snapshot | None, pending: Mapping[int, RewrittenDeleteGroup]
    ) -> dict[int, str]:
        if table.metadata.format_version > 2:
            raise CommitConflictError(
                f"table {identifier}: upgraded to format version "
                f"{table.metadata.format_version} during the rewrite; nothing committed"
            )
        if head is None:
            raise CommitConflictError(f"table {identifier}: {branch} has no snapshot any more")
        return find_delete_conflicts(table, start_snapshot_id, pending.values(), head, branch)

    def build(
        attempt: SnapshotWriter,
        head: Snapshot,
        pending: dict[int, RewrittenDeleteGroup],
        outcome: DeleteCommitOutcome,
    ) -> Snapshot | None:
        return _write_snapshot(
            attempt, head, start_manifests, pending, outcome, snapshot_properties
        )

    return commit_groups(
        table,
        identifier,
        {g.group_id: g for g in groups},
        validate,
        lambda g: g.outputs,
        build,
        retry=retry,
        sleep=sleep,
        journal=journal,
        branch=branch,
    )


def filter_delete_manifests(
    attempt: SnapshotWriter,
    head: Snapshot,
    remove: set[str],
    read: set[str],
    start: frozenset[str],
    changes: ChangeManifests,
) -> list[ManifestFile]:
    """Carry the head's manifests over without ``remove``; returns them, each entry removed
    gone to ``changes``.

    Data manifests and delete manifests of the start snapshot that held none of ``remove``
    (those not in ``read``) are kept as they are; the others are read, and rewritten with their
    remaining entries as EXISTING when they held one.
    """
    table = attempt.table
    manifests: list[ManifestFile] = []
    for manifest in snapshot_manifests(table.io, head, table.metadata.format_version):
        if manifest.content != ManifestContent.DELETES or (
            manifest.manifest_path not in read and manifest.manifest_path in start
        ):
            manifests.append(manifest)
            continue
        carried = carry_over(attempt, manifest, remove, changes.remove)
        if carried is not None:
            manifests.append(carried)
    return manifests


def _write_snapshot(
    attempt: SnapshotWriter,
    head: Snapshot,
    start_manifests: frozenset[str],
    pending: dict[int, RewrittenDeleteGroup],
    outcome: DeleteCommitOutcome,
    snapshot_properties: dict[str, str],
) -> Snapshot | None:
    group_of = {p: gid for gid, g in pending.items() for p in g.paths}
    read = {m for g in pending.values() for m in g.manifests}
    changes = ChangeManifests(attempt)
    for group in pending.values():
        for data_file in group.outputs:
            changes.add(data_file, group.data_sequence_number)
    manifests = filter_delete_manifests(
        attempt, head, set(group_of), read, start_manifests, changes
    )
    reason = "a replaced delete file is no longer live in the table"
    if refuse_vanished(attempt, group_of, changes, pending, outcome, reason):
        return None
    return replace_snapshot(
        attempt, head, changes.close() + manifests, changes, snapshot_properties
    )
