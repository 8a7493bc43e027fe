"""Commit converted equality deletes as one ``replace`` snapshot on a branch.

The snapshot adds the position delete files of the committed groups, each with the data
sequence number its conversion chose, and removes their partitions' equality delete files and
every global equality delete whose groups are all committed; data files are not touched. The
head's other manifests are carried over (:func:`~compactor.commit.delete_commit.filter_delete_manifests`).

Validated per group against every snapshot committed on the branch since the start
(:func:`find_conversion_conflicts`), through :func:`~compactor.commit.committer.commit_groups`
as every rewrite is: retried on conflict, refused groups reported. Removing an equality delete
is safe only while the data files it applies to are exactly those the conversion read, so a
group is refused when one of its equality deletes or data files was removed, or a data file
was added that one of its deletes applies to (a rewrite committed with an older data sequence
number) or at a path it read; a global delete stays when a data file it applies to was added
anywhere. Appends (newer than every delete), new equality deletes and new position deletes
never conflict: the new deletes stay, and apply as they would have.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from pyiceberg.manifest import DataFile, DataFileContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from compactor.commit.change_manifests import ChangeManifests
from compactor.commit.committer import (
    CommitJournal,
    CommitOutcome,
    commit_groups,
    discard,
    refuse_vanished,
    replace_snapshot,
)
from compactor.commit.delete_commit import filter_delete_manifests
from compactor.commit.retry import RetryPolicy
from compactor.commit.snapshot_writer import SnapshotWriter
from compactor.commit.validation import entries_added_by, new_snapshots
from compactor.errors import CommitConflictError
from compactor.iceberg.pyiceberg_compat import delete_file_key, referenced_data_file
from compactor.iceberg.value_keys import same_partition
from compactor.planning.equality_groups import EqualityPlan
from compactor.rewrite.equality_conversion import ConvertedGroup

ConversionOutcome = CommitOutcome[ConvertedGroup]


def find_conversion_conflicts(
    table: Table,
    plan: EqualityPlan,
    groups: Mapping[int, ConvertedGroup],
    head: Snapshot | None,
) -> tuple[dict[int, str], dict[str, str]]:
    """Group id -> why committing it now would be wrong, and global delete -> why it must stay,
    from every snapshot committed on the plan's branch since its start."""
    conflicts: dict[int, str] = {}
    kept: dict[str, str] = {}
    if head is None or head.snapshot_id == plan.snapshot_id:
        return conflicts, kept
    seqs = plan.sequence_numbers
    deletes_of = {p: gid for gid, g in groups.items() for p in g.paths}
    replaced_of = {key: gid for gid, g in groups.items() for key in g.replaced}
    readers: dict[str, list[int]] = {}
    for gid, g in groups.items():
        for path in g.input_paths | g.target_paths:
            readers.setdefault(path, []).append(gid)
    globals_of: dict[str, list[int]] = {}
    for gid, g in groups.items():
        for path in g.global_deletes:
            globals_of.setdefault(path, []).append(gid)
    newest_own = {gid: max((seqs[p] for p in g.paths), default=0) for gid, g in groups.items()}
    for snapshot in new_snapshots(table, plan.snapshot_id, head, plan.branch):
        sid = snapshot.snapshot_id
        for entry in entries_added_by(table, snapshot):
            data_file = entry.data_file
            path = data_file.file_path
            if entry.status == ManifestEntryStatus.DELETED:
                key = delete_file_key(data_file)
                if key in replaced_of:
                    conflicts.setdefault(
                        replaced_of[key],
                        f"position delete {key} it merges was removed by snapshot {sid}",
                    )
                if path in deletes_of:
                    conflicts.setdefault(
                        deletes_of[path], f"equality delete {path} was removed by snapshot {sid}"
                    )
                if path in plan.global_deletes:
                    kept.setdefault(path, f"removed by snapshot {sid}")
                    for gid in globals_of.get(path, ()):
                        conflicts.setdefault(
                            gid, f"global equality delete {path} was removed by snapshot {sid}"
                        )
                if data_file.content == DataFileContent.DATA:
                    for gid in readers.get(path, ()):
                        conflicts.setdefault(
                            gid, f"data file {path} it read was removed by snapshot {sid}"
                        )
                continue
            if entry.status != ManifestEntryStatus.ADDED:
                continue
            if data_file.content == DataFileContent.POSITION_DELETES:
                _new_position_deletes(plan, groups, data_file, sid, conflicts)
                continue
            if data_file.content != DataFileContent.DATA:
                continue
            seq = entry.sequence_number or snapshot.sequence_number or 0
            for gid in readers.get(path, ()):
                conflicts.setdefault(gid, f"data file {path} it read was added by snapshot {sid}")
            for gid, g in groups.items():
                if (
                    seq < newest_own[gid]
                    and data_file.spec_id == g.spec_id
                    and same_partition(data_file.partition, g.partition)
                ):
                    conflicts.setdefault(
                        gid,
                        f"data file {path} added by snapshot {sid} with data sequence number "
                        f"{seq}: an equality delete of the partition applies to it",
                    )
            for global_path in plan.global_deletes:
                if seq < seqs[global_path]:
                    kept.setdefault(
                        global_path,
                        f"data file {path} it applies to was added by snapshot {sid}",
                    )
    return conflicts, kept


def _new_position_deletes(
    plan: EqualityPlan,
    groups: Mapping[int, ConvertedGroup],
    delete_file: DataFile,
    snapshot_id: int,
    conflicts: dict[int, str],
) -> None:
    """Format 3: refuse the groups writing a deletion vector for a data file that gained a
    position delete meanwhile (a data file has one deletion vector at most, and readers ignore
    position delete files where it has one: the new deletes would be lost)."""
    if plan.format_version < 3:
        return  # position delete files add up: the new ones still apply
    target = referenced_data_file(delete_file)
    for gid, g in groups.items():
        if target is not None:
            hit = target in g.target_paths
        else:
            hit = delete_file.spec_id == g.spec_id and same_partition(
                delete_file.partition, g.partition
            )
        if hit:
            conflicts.setdefault(
                gid,
                f"position delete {delete_file_key(delete_file)} for a data file it writes a "
                f"deletion vector for was added by snapshot {snapshot_id}",
            )


def commit_equality_conversion(
    table: Table,
    identifier: str,
    plan: EqualityPlan,
    groups: list[ConvertedGroup],
    snapshot_properties: dict[str, str],
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    journal: CommitJournal | None = None,
) -> ConversionOutcome:
    """Commit the converted ``groups`` as one ``replace`` snapshot on the plan's branch; refused
    groups are reported, and the global deletes removed are ``outcome.removed_delete_files``.

    The caller owns the outputs of refused groups and deletes them. Raises
    :class:`CommitStateUnknownError` when the catalog cannot tell whether the commit landed.
    """
    kept: dict[str, str] = {}  # global deletes that stay: in conflict, or gone

    def validate(head: Snapshot | None, pending: Mapping[int, ConvertedGroup]) -> dict[int, str]:
        version = table.metadata.format_version
        if version != plan.format_version:
            raise CommitConflictError(
                f"table {identifier}: upgraded to format version {version} during the "
                "conversion; nothing committed"
            )
        if head is None:
            raise CommitConflictError(f"table {identifier}: {plan.branch} has no snapshot any more")
        conflicts, stay = find_conversion_conflicts(table, plan, pending, head)
        kept.update(stay)
        return conflicts

    def build(
        attempt: SnapshotWriter,
        head: Snapshot,
        pending: dict[int, ConvertedGroup],
        outcome: ConversionOutcome,
    ) -> Snapshot | None:
        return _write_snapshot(attempt, head, plan, pending, outcome, kept, snapshot_properties)

    return commit_groups(
        table,
        identifier,
        {g.group_id: g for g in groups},
        validate,
        lambda g: g.output_files,
        build,
        retry=retry,
        sleep=sleep,
        journal=journal,
        branch=plan.branch,
    )


def removable_globals(
    plan: EqualityPlan, committed: Mapping[int, object], kept: Mapping[str, str]
) -> list[str]:
    """The global deletes a commit of the ``committed`` groups removes: those not ``kept``
    whose every group is committed."""
    return sorted(
        path
        for path, targets in plan.global_targets().items()
        if path not in kept and targets <= committed.keys()
    )


def _write_snapshot(
    attempt: SnapshotWriter,
    head: Snapshot,
    plan: EqualityPlan,
    pending: dict[int, ConvertedGroup],
    outcome: ConversionOutcome,
    kept: dict[str, str],
    snapshot_properties: dict[str, str],
) -> Snapshot | None:
    group_of = {p: gid for gid, g in pending.items() for p in [*g.paths, *g.replaced]}
    globals_removed = removable_globals(plan, pending, kept)
    read = {m for g in pending.values() for m in g.manifests}
    read |= {g.previous_manifests[key] for g in pending.values() for key in g.replaced}
    read |= {plan.global_deletes[p][1] for p in globals_removed}
    changes = ChangeManifests(attempt)
    for group in pending.values():
        for data_file, sequence_number in group.outputs:
            changes.add(data_file, sequence_number)
    manifests = filter_delete_manifests(
        attempt, head, set(group_of) | set(globals_removed), read, plan.start_manifests, changes
    )
    reason = "a converted equality delete or a merged position delete is no longer live"
    if refuse_vanished(attempt, group_of, changes, pending, outcome, reason):
        return None
    gone = [p for p in globals_removed if p not in changes]
    if gone:  # removed without a trace in the branch's history: leave it, and its groups
        for path in gone:
            kept[path] = "no longer live in the table"
            for gid, g in list(pending.items()):
                if path in g.global_deletes:
                    outcome.conflicts[gid] = f"global equality delete {path} is no longer live"
                    pending.pop(gid)
        discard(attempt, changes)
        return None
    if not changes.entries:  # what is left changes nothing: commit nothing
        pending.clear()
        discard(attempt, changes)
        return None
    outcome.removed_delete_files = [changes.removed_delete_files[p] for p in globals_removed]
    return replace_snapshot(
        attempt, head, changes.close() + manifests, changes, snapshot_properties
    )
