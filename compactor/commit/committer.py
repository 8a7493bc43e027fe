"""Commit rewritten groups as one Iceberg ``replace`` snapshot, validated like Java's RewriteFiles.

Rules (Iceberg spec and the Java reference):
- the new snapshot's operation is ``replace``; its parent is the branch head at commit time;
- every input file must still be live at the head; a group whose input was removed or replaced
  since the start snapshot, or which gained a position delete or deletion vector, is dropped;
- appends by others never conflict; neither do equality deletes: new files carry the start
  snapshot's data sequence number, so equality deletes committed after the start still apply
  to the rewritten rows (Java's RewriteFiles with a data sequence number ignores them too);
- delete files that apply to no live data file once the groups are committed go in the same
  commit (position and equality deletes, as Java's remove-dangling-deletes);
- catalog conflicts are retried after a refresh with exponential backoff, bounded in count
  and time, re-validating each time.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeVar

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
)

from compactor.commit.change_manifests import ChangeManifests, replace_summary, summary_collector
from compactor.commit.retry import RetryPolicy, is_refusal, is_retryable
from compactor.commit.snapshot_writer import SnapshotWriter, branch_commit, carry_over
from compactor.commit.validation import entries_added_by, missing_outputs, new_snapshots
from compactor.errors import CommitConflictError, CommitStateUnknownError, first_line
from compactor.iceberg.pyiceberg_compat import (
    PositionDeleteIndex,
    delete_file_key,
    is_deletion_vector,
    referenced_data_file,
    snapshot_manifests,
)
from compactor.iceberg.value_keys import same_partition
from compactor.planning.planner import (
    CommitContext,
    FileGroup,
    InputFile,
    Plan,
    is_unpartitioned,
)
from compactor.planning.tasks import TaskResult

log = logging.getLogger(__name__)


# What a commit takes and reports per group: a data rewrite's TaskResult, a delete rewrite's group.
G = TypeVar("G")


@dataclass
class CommitOutcome(Generic[G]):
    """Which groups a commit included, which it refused and why, and the snapshot it made."""

    snapshot_id: int | None = None
    committed: list[G] = field(default_factory=list)
    conflicts: dict[int, str] = field(default_factory=dict)
    removed_delete_files: list[DataFile] = field(default_factory=list)
    attempts: int = 0


R = TypeVar("R")


def with_outcome(result: R, outcome: CommitOutcome[G] | None) -> R:
    """``result``, a dataclass with ``snapshot_id``, ``committed``, ``conflicts`` and
    ``attempts``, with what the commit did; as it is when no commit was made."""
    if outcome is None:
        return result
    return replace(  # type: ignore[type-var]
        result,
        snapshot_id=outcome.snapshot_id,
        committed=outcome.committed,
        conflicts=outcome.conflicts,
        attempts=outcome.attempts,
    )


def find_conflicts(
    table: Table, plan: Plan, groups: list[FileGroup], head: Snapshot | None
) -> dict[int, str]:
    """Group id -> why committing it now would be unsafe, from every snapshot since the plan's."""
    conflicts: dict[int, str] = {}
    if head is None or head.snapshot_id == plan.snapshot_id:
        return conflicts
    group_of = {f.path: g.group_id for g in groups for f in g.files}
    for snapshot in new_snapshots(table, plan.snapshot_id, head, plan.options.branch):
        operation = snapshot.summary.operation if snapshot.summary else None
        if operation == Operation.APPEND:
            continue
        new_position_deletes = PositionDeleteIndex()
        has_position_deletes = False
        for entry in entries_added_by(table, snapshot):
            data_file = entry.data_file
            if entry.status == ManifestEntryStatus.DELETED and data_file.file_path in group_of:
                conflicts.setdefault(
                    group_of[data_file.file_path],
                    f"input {data_file.file_path} was removed by snapshot {snapshot.snapshot_id}",
                )
            if entry.status != ManifestEntryStatus.ADDED:
                continue
            if is_deletion_vector(data_file):
                target = referenced_data_file(data_file)
                if target in group_of:
                    conflicts.setdefault(
                        group_of[target],
                        f"deletion vector in {data_file.file_path} for input {target} "
                        f"added by snapshot {snapshot.snapshot_id}",
                    )
            elif data_file.content == DataFileContent.POSITION_DELETES:
                new_position_deletes.add_delete_file(entry)
                has_position_deletes = True
            elif data_file.content == DataFileContent.EQUALITY_DELETES:
                _moved_out_of_reach(table, groups, data_file, snapshot.snapshot_id, conflicts)
        if has_position_deletes:
            for g in groups:
                for f in g.files:
                    hits = new_position_deletes.for_data_file(f.data_sequence_number, f.data_file)
                    if hits:
                        path = sorted(d.file_path for d in hits)[0]
                        conflicts.setdefault(
                            g.group_id,
                            f"position delete {path} for input {f.path} added by snapshot {snapshot.snapshot_id}",
                        )
    return conflicts


def _moved_out_of_reach(
    table: Table,
    groups: list[FileGroup],
    delete_file: DataFile,
    snapshot_id: int,
    conflicts: dict[int, str],
) -> None:
    """Refuse groups moving inputs to another spec that a new equality delete scoped to their
    old partition applies to: in the new spec's partitions it would no longer reach them.

    (Groups that keep their partition keep the start snapshot's sequence number, so new
    equality deletes still apply to their rows; global ones reach every partition.)
    """
    if is_unpartitioned(table.metadata.specs()[delete_file.spec_id]):
        return
    for group in groups:
        if not group.repartition:
            continue
        for f in group.files:
            if f.data_file.spec_id == delete_file.spec_id and same_partition(
                f.data_file.partition, delete_file.partition
            ):
                conflicts.setdefault(
                    group.group_id,
                    f"equality delete {delete_file.file_path} for the partition of input {f.path} "
                    f"added by snapshot {snapshot_id}",
                )
                break


def _filter_manifests(
    attempt: SnapshotWriter,
    head: Snapshot,
    context: CommitContext,
    inputs: dict[str, InputFile],
    dangling: set[str],
    changes: ChangeManifests,
) -> list[ManifestFile]:
    """Carry the head's manifests over without the inputs and dangling delete files.

    Manifests that hold none of them are kept as they are; manifests whose every live file goes
    are dropped; the others are rewritten with their remaining entries as EXISTING. Returns the
    manifests; each removed file's live entry goes to ``changes`` as it is found (the caller can
    then tell which inputs are no longer live). Manifests of the plan's snapshot are read again
    only when the plan cannot tell what to do with them.
    """
    io, version = attempt.table.io, attempt.table.metadata.format_version
    remove = inputs.keys() | dangling
    by_manifest: dict[str, list[str]] = defaultdict(list)
    for path, f in inputs.items():
        by_manifest[f.manifest_path].append(path)
    manifests: list[ManifestFile] = []
    for manifest in snapshot_manifests(io, head, version):
        path = manifest.manifest_path
        if path in context.start_manifests:
            live = context.manifest_live_entries.get(path)
            known = by_manifest.get(path, [])
            may_hold_dangling = bool(dangling) and manifest.content == ManifestContent.DELETES
            if live is None or not (known or may_hold_dangling):
                manifests.append(manifest)  # pruned by the filter, or holds nothing to remove
                continue
            planned = [e for p in known if (e := inputs[p].entry) is not None]
            if len(known) == live and len(planned) == live:
                for e in planned:
                    changes.remove(delete_file_key(e.data_file), e)
                continue
        carried = carry_over(attempt, manifest, remove, changes.remove)
        if carried is not None:
            manifests.append(carried)
    return manifests


class CommitJournal(Protocol):
    """Where a run records what it is about to do, so a crash or a lost answer leaves a trace
    (:class:`compactor.commit.inflight.RunLease`)."""

    def add_files(self, paths: list[str]) -> None:
        """Record metadata files before they are written."""

    def committing(self, snapshot_id: int, parent_id: int | None, branch: str) -> None:
        """Record a commit before it is sent; raise if the run may no longer commit."""

    def refused(self, snapshot_id: int) -> None:
        """The catalog refused that commit for certain."""


def commit_replace(
    table: Table,
    plan: Plan,
    context: CommitContext,
    results: list[TaskResult],
    snapshot_properties: dict[str, str],
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rewritten_before: frozenset[str] = frozenset(),
    journal: CommitJournal | None = None,
) -> CommitOutcome[TaskResult]:
    """Commit ``results`` as one ``replace`` snapshot on the plan's branch; refused groups are
    reported, not raised.

    Each result is matched to its group of ``plan`` by ``task_id``: the plan, which stays in the
    driver, holds the inputs' manifest entries the commit removes; ``context`` (planned with it)
    which manifests the plan read and which delete files its inputs have. The caller owns the output
    files of refused groups (``outcome.conflicts``) and deletes them. ``rewritten_before`` are
    the input files the run's earlier commits replaced: a position delete file whose data files
    were rewritten partly then and partly now is retired now. ``journal`` is told of every
    metadata file and every catalog call first (:class:`CommitJournal`). A group whose output
    files are not all still in storage is refused.

    Raises :class:`CommitStateUnknownError` when the catalog cannot tell whether the commit
    was applied: every file stays, since the table may reference them.
    """

    def validate(head: Snapshot | None, pending: Mapping[int, TaskResult]) -> dict[int, str]:
        return find_conflicts(table, plan, [plan.group(gid) for gid in pending], head)

    def build(
        attempt: SnapshotWriter,
        head: Snapshot,
        pending: dict[int, TaskResult],
        outcome: CommitOutcome[TaskResult],
    ) -> Snapshot | None:
        return _write_snapshot(
            attempt, plan, context, head, pending, outcome, snapshot_properties, rewritten_before
        )

    return commit_groups(
        table,
        plan.table,
        {r.task_id: r for r in results},
        validate,
        lambda r: r.data_files,
        build,
        retry=retry,
        sleep=sleep,
        journal=journal,
        branch=plan.options.branch,
    )


def commit_groups(
    table: Table,
    identifier: str,
    groups: Mapping[int, G],
    validate: Callable[[Snapshot | None, Mapping[int, G]], dict[int, str]],
    outputs: Callable[[G], Iterable[DataFile]],
    build: Callable[[SnapshotWriter, Snapshot, dict[int, G], CommitOutcome[G]], Snapshot | None],
    *,
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    journal: CommitJournal | None = None,
    branch: str = MAIN_BRANCH,
    snapshot_id: int | None = None,
) -> CommitOutcome[G]:
    """Commit rewritten ``groups`` (by group id) as one snapshot on ``branch``; the groups
    refused are reported, not raised. Data and delete rewrites both commit through it.

    Each attempt (:func:`commit_on_branch`) first refuses the groups ``validate(head, pending)``
    finds in conflict with what was committed since the start, and those whose ``outputs`` are
    not all in storage any more; ``build(attempt, head, pending, outcome)`` then writes the
    snapshot of the others, or refuses more (out of ``pending``, into ``outcome.conflicts``)
    and returns None to validate again. ``retry`` defaults to the table's ``commit.retry.*``.
    """
    outcome: CommitOutcome[G] = CommitOutcome()
    pending = dict(groups)

    def prepare() -> Snapshot | None:
        outcome.attempts += 1
        head = table.metadata.snapshot_by_name(branch)
        refused = validate(head, pending)
        refused.update(missing_outputs(table, {gid: outputs(g) for gid, g in pending.items()}))
        for group_id, reason in refused.items():
            outcome.conflicts.setdefault(group_id, reason)
            pending.pop(group_id, None)
        return head if pending else None

    outcome.snapshot_id = commit_on_branch(
        table,
        identifier,
        prepare,
        lambda attempt, head: build(attempt, head, pending, outcome),
        retry=retry or RetryPolicy.for_table(table),
        sleep=sleep,
        journal=journal,
        branch=branch,
        snapshot_id=snapshot_id,
    )
    if outcome.snapshot_id is not None:
        outcome.committed = list(pending.values())
    return outcome


def refuse_vanished(
    attempt: SnapshotWriter,
    group_of: Mapping[str, int],
    changes: ChangeManifests,
    pending: dict[int, G],
    outcome: CommitOutcome[G],
    reason: str,
) -> bool:
    """Refuse the groups with a file to remove (``group_of``: path -> group id) that the head
    no longer lists (not removed in ``changes``); whether there was one: the attempt is then
    discarded."""
    missing = {gid for path, gid in group_of.items() if path not in changes}
    for gid in missing:
        outcome.conflicts[gid] = reason
        pending.pop(gid)
    if missing:
        discard(attempt, changes)
    return bool(missing)


def discard(attempt: SnapshotWriter, changes: ChangeManifests) -> None:
    """Give up ``attempt``: its change manifests are closed, then every file it wrote deleted."""
    changes.close()
    attempt.discard()


def commit_on_branch(
    table: Table,
    identifier: str,
    prepare: Callable[[], Snapshot | None],
    build: Callable[[SnapshotWriter, Snapshot], Snapshot | None],
    *,
    retry: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    journal: CommitJournal | None = None,
    branch: str = MAIN_BRANCH,
    snapshot_id: int | None = None,
) -> int | None:
    """Commit one snapshot on ``branch``, retrying catalog conflicts; its id, or None if none
    was due.

    Each attempt, ``prepare()`` validates against the table as it is now and returns the
    branch's head, or None when nothing is left to commit; ``build(attempt, head)`` writes the manifests
    (through ``attempt``) and returns the snapshot, or None to validate again. ``journal`` is
    told of every metadata file before it is written and of every catalog call before it is
    made. Raises :class:`CommitConflictError` once the table's ``commit.retry.*`` budget is
    spent, and :class:`CommitStateUnknownError` when the catalog's answer does not prove the
    commit was refused (:func:`is_refusal`) and the table does not show it: every file stays,
    since the request may still be applied.
    """
    # The id of the snapshot: given when files written beforehand name it (their manifests'
    # added_snapshot_id), else a new one.
    snapshot_id = table.metadata.new_snapshot_id() if snapshot_id is None else snapshot_id
    started = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        # Other branches may have moved since the table was loaded: the new snapshot's sequence
        # number must follow the table's last one, not the one this process last saw.
        table.refresh()
        head = prepare()
        if head is None:
            return None
        attempt = SnapshotWriter(table, snapshot_id, journal.add_files if journal else None)
        in_catalog_call = False
        try:
            snapshot = build(attempt, head)
            if snapshot is None:
                continue  # files vanished without a conflicting snapshot in history; re-validate
            requirements, updates = branch_commit(
                table.metadata, branch, head.snapshot_id, [snapshot]
            )
            if journal is not None:
                journal.committing(snapshot_id, head.snapshot_id, branch)
            in_catalog_call = True
            table.catalog.commit_table(table, requirements, updates)
        except BaseException as exc:
            if in_catalog_call and not is_refusal(exc):
                # The request may have been applied, or may be applied later (a gateway or a
                # slow catalog): never delete what the table may come to reference.
                if isinstance(exc, Exception) and _landed(table, snapshot_id):
                    return snapshot_id
                if not isinstance(exc, Exception):
                    raise  # interrupted: the run record keeps the files for the next run
                raise CommitStateUnknownError(
                    f"table {identifier}: the catalog did not say whether snapshot {snapshot_id} "
                    f"was committed ({type(exc).__name__}: {first_line(exc)}); its files are kept "
                    "until it lands or can no longer land"
                ) from exc
            attempt.discard()
            if journal is not None and in_catalog_call:
                journal.refused(snapshot_id)
            retryable = in_catalog_call and is_retryable(exc)
            if not (retryable or isinstance(exc, CommitFailedException)):
                raise
            elapsed_ms = (time.monotonic() - started) * 1000
            if attempts > retry.num_retries or elapsed_ms > retry.total_timeout_ms:
                raise CommitConflictError(
                    f"table {identifier}: commit still conflicting after {attempts} attempts: "
                    f"{first_line(exc)}"
                ) from exc
            log.info("commit conflict on %s, retrying (%d): %s", identifier, attempts, exc)
            sleep(retry.wait_s(attempts - 1))
            table.refresh()
            continue
        table.refresh()
        return snapshot_id


def _landed(table: Table, snapshot_id: int) -> bool:
    """Whether the table now has ``snapshot_id``; False when the catalog cannot tell."""
    try:
        table.refresh()
    except Exception:
        return False
    return table.metadata.snapshot_by_id(snapshot_id) is not None


def _write_snapshot(
    attempt: SnapshotWriter,
    plan: Plan,
    context: CommitContext,
    head: Snapshot,
    pending: dict[int, TaskResult],
    outcome: CommitOutcome[TaskResult],
    snapshot_properties: dict[str, str],
    rewritten_before: frozenset[str],
) -> Snapshot | None:
    table = attempt.table
    groups = {gid: plan.group(gid) for gid in pending}
    rewritten: dict[str, int] = {}
    inputs: dict[str, InputFile] = {}
    for gid, group in groups.items():
        for f in group.files:
            path = f.path  # decoded once: one string for both (130,000 files: 21 MB)
            rewritten[path], inputs[path] = gid, f
    dangling = {
        path: delete_file
        for path, (delete_file, targets) in context.delete_file_targets.items()
        if (targets & rewritten.keys() or not targets)
        and targets <= rewritten.keys() | rewritten_before
    }
    data_sequence_number = plan.sequence_number if table.metadata.format_version > 1 else None
    changes = ChangeManifests(attempt)
    for result in pending.values():
        for data_file in result.data_files:
            changes.add(data_file, data_sequence_number)
    manifests = _filter_manifests(attempt, head, context, inputs, set(dangling), changes)
    if refuse_vanished(
        attempt,
        rewritten,
        changes,
        pending,
        outcome,
        "an input file is no longer live in the table",
    ):
        return None
    outcome.removed_delete_files = [
        changes.removed_delete_files[p] for p in dangling if p in changes
    ]
    return replace_snapshot(
        attempt, head, changes.close() + manifests, changes, snapshot_properties
    )


def replace_snapshot(
    attempt: SnapshotWriter,
    head: Snapshot,
    manifests: list[ManifestFile],
    changes: ChangeManifests | None,
    snapshot_properties: dict[str, str],
) -> Snapshot:
    """The ``replace`` snapshot over ``head`` listing ``manifests`` (data manifests first), its
    summary counting what ``changes`` added and removed (None: no file)."""
    metadata = attempt.table.metadata
    ordered = [m for m in manifests if m.content == ManifestContent.DATA]
    ordered += [m for m in manifests if m.content == ManifestContent.DELETES]
    sequence_number = metadata.next_sequence_number()
    manifest_list, lineage = attempt.manifest_list(head.snapshot_id, sequence_number, ordered)
    collector = changes.summary if changes is not None else summary_collector(metadata)
    return Snapshot(
        snapshot_id=attempt.snapshot_id,
        parent_snapshot_id=head.snapshot_id,
        sequence_number=sequence_number,
        manifest_list=manifest_list,
        summary=replace_summary(collector, head, snapshot_properties),
        schema_id=metadata.current_schema_id,
        **lineage,
    )
