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
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from pyiceberg.exceptions import (
    BadRequestError,
    CommitFailedException,
    ForbiddenError,
    NoSuchTableError,
    UnauthorizedError,
)
from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
)
from pyiceberg.utils.properties import property_as_int

from compactor.errors import CommitConflictError, CommitStateUnknownError, first_line
from compactor.iceberg.pyiceberg_compat import (
    PositionDeleteIndex,
    delete_file_key,
    is_deletion_vector,
    manifest_entries,
    manifest_writer,
    referenced_data_file,
    snapshot_manifests,
    write_manifest_list,
)
from compactor.iceberg.value_keys import same_partition
from compactor.planning.planner import FileGroup, InputFile, Plan, is_unpartitioned
from compactor.planning.tasks import TaskResult
from compactor.storage.deleter import delete_files

log = logging.getLogger(__name__)


@dataclass
class CommitOutcome:
    """Which groups a commit included, which it refused and why, and the snapshot it made."""

    snapshot_id: int | None = None
    committed: list[TaskResult] = field(default_factory=list)
    conflicts: dict[int, str] = field(default_factory=dict)
    removed_delete_files: list[DataFile] = field(default_factory=list)
    attempts: int = 0


# What catalogs say when they refuse a snapshot built on a table state that has moved on.
STALE_SNAPSHOT_REFUSALS = (
    "older than last sequence number",  # pyiceberg, Iceberg Java (REST)
    "first row id smaller than the table's next-row-id",  # pyiceberg, format 3
    "first-row-id is behind table next-row-id",  # Iceberg Java (REST), format 3
)


@dataclass
class RetryPolicy:
    """Commit retries, from the table's ``commit.retry.*`` properties (Iceberg defaults)."""

    num_retries: int = TableProperties.COMMIT_NUM_RETRIES_DEFAULT
    min_wait_ms: int = 100
    max_wait_ms: int = 60_000
    total_timeout_ms: int = 1_800_000

    @classmethod
    def for_table(cls, table: Table) -> RetryPolicy:
        props = table.metadata.properties

        def get(name: str, default: int) -> int:
            return max(0, property_as_int(props, name, default) or 0)

        return cls(
            num_retries=get(TableProperties.COMMIT_NUM_RETRIES, cls.num_retries),
            min_wait_ms=get(TableProperties.COMMIT_MIN_RETRY_WAIT_MS, cls.min_wait_ms),
            max_wait_ms=get(TableProperties.COMMIT_MAX_RETRY_WAIT_MS, cls.max_wait_ms),
            total_timeout_ms=get(TableProperties.COMMIT_TOTAL_RETRY_TIME_MS, cls.total_timeout_ms),
        )

    def wait_s(self, attempt: int) -> float:
        wait = min(self.max_wait_ms, self.min_wait_ms * 2**attempt)
        return wait * (0.5 + random.random() / 2) / 1000


def _new_snapshots(
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


def _entries_added_by(table: Table, snapshot: Snapshot) -> Iterable[ManifestEntry]:
    version = table.metadata.format_version
    for manifest in snapshot_manifests(table.io, snapshot, version):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest_entries(table.io, manifest, version, discard_deleted=False):
            if entry.snapshot_id == snapshot.snapshot_id:
                yield entry


def find_conflicts(
    table: Table, plan: Plan, groups: list[FileGroup], head: Snapshot | None
) -> dict[int, str]:
    """Group id -> why committing it now would be unsafe, from every snapshot since the plan's."""
    conflicts: dict[int, str] = {}
    if head is None or head.snapshot_id == plan.snapshot_id:
        return conflicts
    group_of = {f.path: g.group_id for g in groups for f in g.files}
    for snapshot in _new_snapshots(table, plan.snapshot_id, head, plan.options.branch):
        operation = snapshot.summary.operation if snapshot.summary else None
        if operation == Operation.APPEND:
            continue
        new_position_deletes = PositionDeleteIndex()
        has_position_deletes = False
        for entry in _entries_added_by(table, snapshot):
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


class CommitJournal(Protocol):
    """Where a run records what it is about to do, so a crash or a lost answer leaves a trace
    (:class:`compactor.commit.inflight.RunLease`)."""

    def add_files(self, paths: list[str]) -> None:
        """Record metadata files before they are written."""

    def committing(self, snapshot_id: int, parent_id: int | None, branch: str) -> None:
        """Record a commit before it is sent; raise if the run may no longer commit."""

    def refused(self, snapshot_id: int) -> None:
        """The catalog refused that commit for certain."""


class _Attempt:
    """One try at writing the new snapshot's manifests and manifest list."""

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


def _filter_manifests(
    attempt: _Attempt,
    head: Snapshot,
    plan: Plan,
    inputs: dict[str, InputFile],
    dangling: set[str],
) -> tuple[list[ManifestFile], dict[str, ManifestEntry]]:
    """Carry the head's manifests over without the inputs and dangling delete files.

    Manifests that hold none of them are kept as they are; manifests whose every live file goes
    are dropped; the others are rewritten with their remaining entries as EXISTING. Returns the
    manifests and, per removed path, the live entry found for it (the caller records those as
    DELETED and can tell which inputs are no longer live). Manifests of the plan's snapshot are
    read again only when the plan cannot tell what to do with them.
    """
    io, version = attempt.table.io, attempt.table.metadata.format_version
    remove = inputs.keys() | dangling
    by_manifest: dict[str, list[str]] = defaultdict(list)
    for path, f in inputs.items():
        by_manifest[f.manifest_path].append(path)
    manifests: list[ManifestFile] = []
    found: dict[str, ManifestEntry] = {}
    for manifest in snapshot_manifests(io, head, version):
        path = manifest.manifest_path
        if path in plan.start_manifests:
            live = plan.manifest_live_entries.get(path)
            known = by_manifest.get(path, [])
            may_hold_dangling = bool(dangling) and manifest.content == ManifestContent.DELETES
            if live is None or not (known or may_hold_dangling):
                manifests.append(manifest)  # pruned by the filter, or holds nothing to remove
                continue
            planned = [inputs[p].entry for p in known]
            if len(known) == live and all(e is not None for e in planned):
                found.update((delete_file_key(e.data_file), e) for e in planned if e is not None)
                continue
        carried = carry_over(attempt, manifest, remove, found)
        if carried is not None:
            manifests.append(carried)
    return manifests, found


def carry_over(
    attempt: _Attempt, manifest: ManifestFile, remove: set[str], found: dict[str, ManifestEntry]
) -> ManifestFile | None:
    """``manifest`` without the live entries whose keys are in ``remove`` (added to ``found``).

    Keys are paths, and for deletion vectors path and blob offset (:func:`delete_file_key`).
    The manifest itself when it holds none of them, None when nothing else is left, otherwise a
    new manifest with the other entries as EXISTING (sequence numbers kept).
    """
    table = attempt.table
    entries = manifest_entries(table.io, manifest, table.metadata.format_version)
    keyed = [(delete_file_key(e.data_file), e) for e in entries]
    kept = [e for key, e in keyed if key not in remove]
    if len(kept) == len(entries):
        return manifest
    found.update((key, e) for key, e in keyed if key in remove)
    if not kept:
        return None
    with attempt.manifest_writer(manifest.partition_spec_id, manifest.content) as writer:
        for entry in kept:
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.EXISTING,
                    snapshot_id=entry.snapshot_id,
                    sequence_number=entry.sequence_number,
                    file_sequence_number=entry.file_sequence_number,
                    data_file=entry.data_file,
                )
            )
    return writer.to_manifest_file()


def _write_changes(
    attempt: _Attempt,
    added: list[DataFile],
    removed: list[ManifestEntry],
    data_sequence_number: int | None,
) -> list[ManifestFile]:
    """One manifest per (spec, content) with the added files and the removed files' DELETED entries."""
    by_key: dict[tuple[int, ManifestContent], list[ManifestEntry]] = defaultdict(list)
    for data_file in added:
        entry = ManifestEntry.from_args(
            status=ManifestEntryStatus.ADDED,
            snapshot_id=attempt.snapshot_id,
            sequence_number=data_sequence_number,
            file_sequence_number=None,
            data_file=data_file,
        )
        by_key[(data_file.spec_id, ManifestContent.DATA)].append(entry)
    for entry in removed:
        data_file = entry.data_file
        content = (
            ManifestContent.DATA
            if data_file.content == DataFileContent.DATA
            else ManifestContent.DELETES
        )
        by_key[(data_file.spec_id, content)].append(
            ManifestEntry.from_args(
                status=ManifestEntryStatus.DELETED,
                snapshot_id=attempt.snapshot_id,
                sequence_number=entry.sequence_number,
                file_sequence_number=entry.file_sequence_number,
                data_file=data_file,
            )
        )
    manifests = []
    for (spec_id, content), entries in sorted(
        by_key.items(), key=lambda kv: (kv[0][1].value, kv[0][0])
    ):
        with attempt.manifest_writer(spec_id, content) as writer:
            for entry in entries:
                writer.add_entry(entry)
        manifests.append(writer.to_manifest_file())
    return manifests


def _summary(
    table: Table,
    head: Snapshot,
    added: list[DataFile],
    removed: list[DataFile],
    props: dict[str, str],
) -> Summary:
    metadata = table.metadata
    schema, specs = metadata.schema(), metadata.specs()
    limit = (
        property_as_int(metadata.properties, TableProperties.WRITE_PARTITION_SUMMARY_LIMIT, 0) or 0
    )
    collector = SnapshotSummaryCollector(partition_summary_limit=limit)
    for data_file in added:
        collector.add_file(data_file, schema=schema, partition_spec=specs[data_file.spec_id])
    for data_file in removed:
        collector.remove_file(data_file, schema=schema, partition_spec=specs[data_file.spec_id])
    # pyiceberg totals only "overwrite"-like operations; compute them so, then relabel.
    totals = update_snapshot_summaries(
        Summary(operation=Operation.OVERWRITE, **collector.build(), **props),
        previous_summary=head.summary.additional_properties if head.summary else None,
    )
    return Summary(operation=Operation.REPLACE, **totals.additional_properties)


def commit_replace(
    table: Table,
    plan: Plan,
    results: list[TaskResult],
    snapshot_properties: dict[str, str],
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rewritten_before: frozenset[str] = frozenset(),
    journal: CommitJournal | None = None,
) -> CommitOutcome:
    """Commit ``results`` as one ``replace`` snapshot on main; refused groups are reported, not raised.

    Each result is matched to its group of ``plan`` by ``task_id``: the plan, which stays in the
    driver, holds the inputs' manifest entries the commit removes. The caller owns the output
    files of refused groups (``outcome.conflicts``) and deletes them. ``rewritten_before`` are
    the input files the run's earlier commits replaced: a position delete file whose data files
    were rewritten partly then and partly now is retired now. ``journal`` is told of every
    metadata file and every catalog call first (:class:`CommitJournal`). A group whose output
    files are not all still in storage is refused.

    Raises :class:`CommitStateUnknownError` when the catalog cannot tell whether the commit
    was applied: every file stays, since the table may reference them.
    """
    retry = retry or RetryPolicy.for_table(table)
    outcome = CommitOutcome()
    pending = {r.task_id: r for r in results}

    def prepare() -> Snapshot | None:
        outcome.attempts += 1
        head = table.metadata.snapshot_by_name(plan.options.branch)
        refused = find_conflicts(table, plan, [plan.group(gid) for gid in pending], head)
        refused.update(_missing_outputs(table, pending.values()))
        for group_id, reason in refused.items():
            outcome.conflicts.setdefault(group_id, reason)
            pending.pop(group_id)
        return head if pending else None

    def build(attempt: _Attempt, head: Snapshot) -> Snapshot | None:
        return _write_snapshot(
            attempt, plan, head, pending, outcome, snapshot_properties, rewritten_before
        )

    outcome.snapshot_id = commit_on_branch(
        table,
        plan.table,
        prepare,
        build,
        retry=retry,
        sleep=sleep,
        journal=journal,
        branch=plan.options.branch,
    )
    if outcome.snapshot_id is not None:
        outcome.committed = list(pending.values())
    return outcome


def commit_on_branch(
    table: Table,
    identifier: str,
    prepare: Callable[[], Snapshot | None],
    build: Callable[[_Attempt, Snapshot], Snapshot | None],
    *,
    retry: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    journal: CommitJournal | None = None,
    branch: str = MAIN_BRANCH,
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
    snapshot_id = table.metadata.new_snapshot_id()
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
        attempt = _Attempt(table, snapshot_id, journal.add_files if journal else None)
        in_catalog_call = False
        try:
            snapshot = build(attempt, head)
            if snapshot is None:
                continue  # files vanished without a conflicting snapshot in history; re-validate
            requirements = (
                AssertTableUUID(uuid=table.metadata.table_uuid),
                AssertRefSnapshotId(ref=branch, snapshot_id=head.snapshot_id),
            )
            ref = table.metadata.refs[branch]
            updates = (
                AddSnapshotUpdate(snapshot=snapshot),
                SetSnapshotRefUpdate(  # keeps the branch's own retention, as Java does
                    ref_name=branch,
                    type=SnapshotRefType.BRANCH,
                    snapshot_id=snapshot.snapshot_id,
                    max_ref_age_ms=ref.max_ref_age_ms,
                    max_snapshot_age_ms=ref.max_snapshot_age_ms,
                    min_snapshots_to_keep=ref.min_snapshots_to_keep,
                ),
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


def is_retryable(exc: BaseException) -> bool:
    """Whether the catalog refused a commit because the table moved on: validate and retry.

    A conflict (409), or a sequence number or (format 3) row ids another branch's commit took
    meanwhile: the catalog applies the updates to the table as it is now and refuses them
    (pyiceberg's SQL catalog: ValueError; a REST server: 400 ValidationException).
    """
    if isinstance(exc, CommitFailedException):
        return True
    return isinstance(exc, ValueError | BadRequestError) and any(
        stale in str(exc) for stale in STALE_SNAPSHOT_REFUSALS
    )


def is_refusal(exc: BaseException) -> bool:
    """Whether the catalog's answer proves the commit was not applied and never will be.

    Only a definite refusal: a conflict or stale-requirement refusal (:func:`is_retryable`),
    or a REST 400, 401, 403 or 404, which the catalog answers before applying anything (the
    failures Iceberg Java's ``SnapshotProducer`` cleans up after). Everything else — a 5xx,
    a timeout, a reset connection, an unreadable answer, any other exception — leaves the
    commit's outcome unknown.
    """
    return is_retryable(exc) or isinstance(
        exc, BadRequestError | UnauthorizedError | ForbiddenError | NoSuchTableError
    )


def _landed(table: Table, snapshot_id: int) -> bool:
    """Whether the table now has ``snapshot_id``; False when the catalog cannot tell."""
    try:
        table.refresh()
    except Exception:
        return False
    return table.metadata.snapshot_by_id(snapshot_id) is not None


def _missing_outputs(table: Table, results: Iterable[TaskResult]) -> dict[int, str]:
    """Groups with an output file no longer in storage (e.g. removed by another run)."""
    missing: dict[int, str] = {}
    for result in results:
        for data_file in result.data_files:
            if not table.io.new_input(data_file.file_path).exists():
                missing[result.task_id] = (
                    f"output {data_file.file_path} is missing from storage; not committing it"
                )
                break
    return missing


def _write_snapshot(
    attempt: _Attempt,
    plan: Plan,
    head: Snapshot,
    pending: dict[int, TaskResult],
    outcome: CommitOutcome,
    snapshot_properties: dict[str, str],
    rewritten_before: frozenset[str],
) -> Snapshot | None:
    table = attempt.table
    groups = {gid: plan.group(gid) for gid in pending}
    rewritten = {f.path: gid for gid, g in groups.items() for f in g.files}
    inputs = {f.path: f for g in groups.values() for f in g.files}
    dangling = {
        path: delete_file
        for path, (delete_file, targets) in plan.delete_file_targets.items()
        if (targets & rewritten.keys() or not targets)
        and targets <= rewritten.keys() | rewritten_before
    }
    manifests, found = _filter_manifests(attempt, head, plan, inputs, set(dangling))
    missing = {gid for path, gid in rewritten.items() if path not in found}
    if missing:
        for gid in missing:
            outcome.conflicts[gid] = "an input file is no longer live in the table"
            pending.pop(gid)
        attempt.discard()
        return None

    added = [df for r in pending.values() for df in r.data_files]
    removed_entries = [found[p] for p in rewritten] + [found[p] for p in dangling if p in found]
    outcome.removed_delete_files = [found[p].data_file for p in dangling if p in found]
    metadata = table.metadata
    data_sequence_number = plan.sequence_number if metadata.format_version > 1 else None
    changes = _write_changes(attempt, added, removed_entries, data_sequence_number)
    removed = [e.data_file for e in removed_entries]
    return replace_snapshot(attempt, head, changes + manifests, added, removed, snapshot_properties)


def replace_snapshot(
    attempt: _Attempt,
    head: Snapshot,
    manifests: list[ManifestFile],
    added: list[DataFile],
    removed: list[DataFile],
    snapshot_properties: dict[str, str],
) -> Snapshot:
    """The ``replace`` snapshot over ``head`` listing ``manifests`` (data manifests first)."""
    metadata = attempt.table.metadata
    ordered = [m for m in manifests if m.content == ManifestContent.DATA]
    ordered += [m for m in manifests if m.content == ManifestContent.DELETES]
    sequence_number = metadata.next_sequence_number()
    manifest_list, lineage = attempt.manifest_list(head.snapshot_id, sequence_number, ordered)
    return Snapshot(
        snapshot_id=attempt.snapshot_id,
        parent_snapshot_id=head.snapshot_id,
        sequence_number=sequence_number,
        manifest_list=manifest_list,
        summary=_summary(attempt.table, head, added, removed, snapshot_properties),
        schema_id=metadata.current_schema_id,
        **lineage,
    )
