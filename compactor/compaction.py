"""One compaction run: lease, plan, tasks, executor, commits — and cleanup, whatever happens.

:func:`compact_table` composes the pieces: it holds the table for the run
(:class:`~compactor.commit.run_scope.RunScope`: lease, record, clean-up), plans (:mod:`compactor.planning.planner`), turns the plan's groups into
:class:`~compactor.planning.tasks.RewriteTask` objects, hands them to an executor
(:mod:`compactor.execute.executors`), and feeds the results, as they arrive, to a
:class:`CommitManager`. Without partial progress the run is all or nothing: a failed group
aborts it, and nothing is committed. With ``commit_every`` set, finished groups are committed in
batches as the run goes, and a failed group fails alone. A file that is missing or not valid
Parquet (:class:`~compactor.errors.UnreadableFileError`) fails no group, either way: it is
quarantined (:mod:`compactor.quarantine`), reported in ``skipped_files`` and in the log, and its
group runs again without it (without the data files it applies to, for a delete file) once the
other groups have run, as long as what is left is worth rewriting by the plan's rules; the file
stays in the table as it is. Planning leaves quarantined files out.
Either way every file the run's tasks
wrote (as their intent files list) and it did not commit is deleted before it returns — unless
a commit's outcome is unknown: then everything stays for the next run, which decides once the
table's state is certain.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from compactor.commit.committer import CommitOutcome, commit_replace
from compactor.commit.inflight import PendingCommit
from compactor.commit.run_scope import RunScope, new_run_id
from compactor.commit.snapshot_writer import SNAPSHOT_PROPERTY_ACTION, SNAPSHOT_PROPERTY_RUN_ID
from compactor.errors import (
    CommitConflictError,
    CompactorError,
    UnreadableFileError,
    first_line,
)
from compactor.execute import make_executor
from compactor.execute.executors import Executor, ThreadExecutor
from compactor.iceberg.catalogs import identifier_of
from compactor.options.compact import CommitOptions, PlanOptions, RewriteOptions
from compactor.options.defaults import MAX_OUTPUT_GROWTH, MIN_FILE_REDUCTION_FOR_GROWTH
from compactor.planning.health import delete_file_kinds
from compactor.planning.planner import (
    CommitContext,
    FileGroup,
    InputFile,
    Plan,
    plan_rewrite,
    skip_reason,
)
from compactor.planning.tasks import RewriteTask, TaskResult, plan_tasks
from compactor.quarantine import Quarantine, QuarantinedFile
from compactor.rewrite.task_runner import EventToken, TaskCancelled
from compactor.sizes import count, format_size, peak_rss_bytes

ERROR, CONFLICT, CANCELLED = "error", "conflict", "cancelled"
# Snapshot summary property: the unreadable files (JSON list of paths) the run had skipped.
UNREADABLE_FILES_PROPERTY = "compactor.unreadable-files"

log = logging.getLogger(__name__)


class Progress(Protocol):
    """Receives progress of a run (the CLI draws a bar on a terminal; otherwise it logs)."""

    def start(self, plan: Plan) -> None: ...
    def advance(self, input_files: int, input_bytes: int) -> None: ...


@dataclass(frozen=True)
class GroupFailure:
    """A group that was not committed: ``kind`` is error, conflict or cancelled."""

    group_id: int
    kind: str
    reason: str


@dataclass(frozen=True)
class SkippedFile:
    """A file that could not be read (missing or not valid Parquet): it was quarantined, and its
    group rewritten without it or, when what was left was not worth it, left as it was."""

    group_id: int
    path: str
    reason: str


@dataclass(frozen=True)
class GrownGroup:
    """A group left as it was: its rewrite was larger than its input and gained nothing else."""

    group_id: int
    input_files: int
    input_bytes: int
    output_files: int
    output_bytes: int


def grown_group(task: RewriteTask, result: TaskResult) -> GrownGroup | None:
    """``task``'s group if its rewrite does not pay off, else None.

    It does not when its output is more than MAX_OUTPUT_GROWTH larger than its input, it applies
    no deletes, moves no rows to another spec, and does not divide the file count by at least
    MIN_FILE_REDUCTION_FOR_GROWTH.
    """
    grown = GrownGroup(
        task.task_id,
        len(task.inputs),
        task.input_bytes,
        len(result.data_files),
        sum(d.file_size_in_bytes for d in result.data_files),
    )
    if (
        grown.output_bytes <= grown.input_bytes * (1 + MAX_OUTPUT_GROWTH)
        or task.delete_files
        or task.repartition
        or grown.output_files * MIN_FILE_REDUCTION_FOR_GROWTH <= grown.input_files
    ):
        return None
    return grown


@dataclass
class RunResult:
    """What a run did; ``to_dict`` is the ``--json`` output."""

    table: str
    plan: Plan
    run_id: str
    dry_run: bool = False
    commits: list[CommitOutcome[TaskResult]] = field(default_factory=list)
    failures: list[GroupFailure] = field(default_factory=list)
    skipped_files: list[SkippedFile] = field(default_factory=list)
    # The table's quarantine after the run: files left out of its plan, or found unreadable.
    quarantined_files: list[QuarantinedFile] = field(default_factory=list)
    grown_groups: list[GrownGroup] = field(default_factory=list)  # left as they were
    recovered_files: list[str] = field(default_factory=list)
    # Commits of abandoned runs that may still land: their files were kept.
    commits_in_doubt: list[PendingCommit] = field(default_factory=list)
    stopped: bool = False
    duration_s: float = 0.0
    backed_off: str | None = None  # why the run did not start: another run holds the table

    @property
    def committed(self) -> list[TaskResult]:
        """Results of the groups committed, in commit order."""
        return [r for c in self.commits for r in c.committed]

    @property
    def committed_groups(self) -> list[FileGroup]:
        """The plan's groups that were committed, in commit order."""
        return [self.plan.group(r.task_id) for r in self.committed]

    @property
    def grown_inputs(self) -> frozenset[frozenset[str]]:
        """The inputs of the groups left as they were because their rewrite grew, in this run
        or (left out by the plan) in an earlier one: see ``compact``'s ``grown_before``."""
        grown = [self.plan.group(g.group_id).inputs for g in self.grown_groups]
        return frozenset([*grown, *self.plan.grown_before])

    @property
    def snapshot_ids(self) -> list[int]:
        return [c.snapshot_id for c in self.commits if c.snapshot_id is not None]

    @property
    def snapshot_id(self) -> int | None:
        """The last snapshot committed, if any."""
        return self.snapshot_ids[-1] if self.snapshot_ids else None

    @property
    def errors(self) -> list[GroupFailure]:
        return [f for f in self.failures if f.kind == ERROR]

    @property
    def conflicts(self) -> list[GroupFailure]:
        """Groups left out because a concurrent commit touched their files."""
        return [f for f in self.failures if f.kind == CONFLICT]

    @property
    def rewritten_files(self) -> list[InputFile]:
        """The data files committed groups replaced."""
        return [f for g in self.committed_groups for f in g.files]

    @property
    def added_files(self) -> list[DataFile]:
        """The data files committed groups added."""
        return [d for r in self.committed for d in r.data_files]

    @property
    def rewritten_bytes(self) -> int:
        return sum(f.size for f in self.rewritten_files)

    @property
    def added_bytes(self) -> int:
        return sum(d.file_size_in_bytes for d in self.added_files)

    @property
    def sorted_failures(self) -> list[GroupFailure]:
        """The groups not committed, by group id."""
        return sorted(self.failures, key=lambda f: f.group_id)

    @property
    def sorted_grown_groups(self) -> list[GrownGroup]:
        """The groups left as they were because their rewrite grew, by group id."""
        return sorted(self.grown_groups, key=lambda g: g.group_id)

    @property
    def duration_ms(self) -> int:
        return round(self.duration_s * 1000)

    def to_dict(self) -> dict[str, Any]:
        committed = self.committed
        rewritten, added = self.rewritten_files, self.added_files
        removed_deletes = [d for c in self.commits for d in c.removed_delete_files]
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "run_id": self.run_id,
            "start_snapshot_id": self.plan.snapshot_id,
            "snapshot_id": self.snapshot_id,
            "snapshot_ids": self.snapshot_ids,
            "strategy": self.plan.options.strategy,
            "groups": len(self.plan.groups),
            "committed_groups": len(committed),
            "failed_groups": [vars(f) for f in self.sorted_failures],
            "skipped_files": [
                vars(f) for f in sorted(self.skipped_files, key=lambda f: (f.group_id, f.path))
            ],
            "quarantined_files": [f.to_dict() for f in self.quarantined_files],
            "grown_groups": [vars(g) for g in self.sorted_grown_groups],
            "rewritten_files": len(rewritten),
            "rewritten_bytes": self.rewritten_bytes,
            "rewritten_delete_files": len(removed_deletes),
            "removed_delete_files": delete_file_kinds(removed_deletes),
            "added_files": len(added),
            "added_bytes": self.added_bytes,
            "records": sum(r.records_read for r in committed),
            "deleted_rows_applied": sum(r.rows_deleted for r in committed),
            "bulk_read_files": sum(r.bulk_read_files for r in committed),
            "recovered_files": len(self.recovered_files),
            "commits_in_doubt": [c.to_dict() for c in self.commits_in_doubt],
            "stopped": self.stopped,
            "backed_off": self.backed_off,
            "duration_ms": self.duration_ms,
            "peak_rss_bytes": peak_rss_bytes(),
            "plan": self.plan.summary(),
        }


class CommitManager:
    """Commits finished tasks in batches of ``commit_batch_size`` and records what happened.

    Tells the run's scope which output files the table now references, and commits inside its
    :meth:`~compactor.commit.run_scope.RunScope.committing` (no clean-up while one is in doubt).
    """

    def __init__(
        self,
        table: Table,
        result: RunResult,
        context: CommitContext,
        options: CommitOptions,
        scope: RunScope,
    ):
        self.table, self.result, self.options, self.scope = table, result, options, scope
        self.plan, self.context = result.plan, context
        self.batch_size = options.commit_batch_size(len(self.plan.groups))
        self.pending: list[TaskResult] = []
        self._rewritten: set[str] = set()  # input files replaced by this run's commits so far
        self.failed_commits = 0  # with partial progress: batches that committed nothing

    def add(self, result: TaskResult) -> None:
        """Take a finished task; commit once a batch is full."""
        self.pending.append(result)
        if len(self.pending) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        """Commit the finished tasks not committed yet."""
        batch, self.pending = self.pending, []
        if batch:
            self._commit(batch)

    def fail(self, group_id: int, kind: str, error: BaseException | str) -> None:
        reason = error if isinstance(error, str) else first_line(error)
        self.result.failures.append(GroupFailure(group_id, kind, reason))

    def leave(self, grown: GrownGroup) -> None:
        """Do not commit a group whose rewrite grew (its outputs are deleted at the end)."""
        self.result.grown_groups.append(grown)
        log.warning(
            "table %s: group %d not committed: its rewrite grew %s -> %s (%d -> %s)",
            self.plan.table,
            grown.group_id,
            format_size(grown.input_bytes),
            format_size(grown.output_bytes),
            grown.input_files,
            count(grown.output_files, "file"),
        )

    def skip(self, group_id: int, error: UnreadableFileError, retried: bool) -> None:
        """Report an unreadable file of a group, quarantined: the group is ``retried`` without
        it, or else left as it was."""
        self.result.skipped_files.append(SkippedFile(group_id, error.path, error.reason))
        log.warning(
            "table %s: group %d: %s; quarantined, %s",
            self.plan.table,
            group_id,
            first_line(error),
            "rewriting the group without it"
            if retried
            else "the group's other files are too few to be worth rewriting: group left as it was",
            extra={"event": "file_unreadable", "table": self.plan.table, "path": error.path},
        )

    def _commit(self, batch: list[TaskResult]) -> None:
        properties = self.scope.snapshot_properties()
        if self.result.skipped_files:
            skipped = sorted({f.path for f in self.result.skipped_files})
            properties[UNREADABLE_FILES_PROPERTY] = json.dumps(skipped)
        try:
            # In doubt from before the catalog call until the committed files are recorded.
            with self.scope.committing():
                outcome = commit_replace(
                    self.table,
                    self.plan,
                    self.context,
                    batch,
                    properties,
                    rewritten_before=frozenset(self._rewritten),
                    journal=self.scope.journal,
                )
                self.scope.keep(d.file_path for r in outcome.committed for d in r.data_files)
        except CommitConflictError as exc:
            if not self.options.partial_progress or self.scope.lost:
                raise
            for r in batch:
                self.fail(r.task_id, CONFLICT, exc)
            self._count_failed_commit()
            return
        for group_id, reason in sorted(outcome.conflicts.items()):
            self.fail(group_id, CONFLICT, reason)
        if outcome.snapshot_id is not None:
            self.result.commits.append(outcome)
            for r in outcome.committed:
                self._rewritten.update(f.path for f in self.plan.group(r.task_id).files)
        elif outcome.conflicts and not self.options.partial_progress:
            reasons = "; ".join(sorted(set(outcome.conflicts.values())))
            raise CommitConflictError(f"table {self.plan.table}: nothing committed: {reasons}")
        elif outcome.conflicts:
            self._count_failed_commit()

    def _count_failed_commit(self) -> None:
        """Stop the run once more batches failed to commit than allowed (Spark's
        partial-progress.max-failed-commits)."""
        self.failed_commits += 1
        allowed = self.options.failed_commits_allowed
        if self.failed_commits > allowed:
            raise CommitConflictError(
                f"table {self.plan.table}: {self.failed_commits} commits failed, more than "
                f"max_failed_commits ({allowed}); stopping"
            )


class _GroupProgress:
    """A run's progress, moved as groups read their inputs (where the executor tells) and,
    for what a group did not tell, when it finishes. Thread-safe: groups read in threads."""

    def __init__(self, progress: Progress) -> None:
        self._progress, self._lock = progress, threading.Lock()
        self._told: dict[int, tuple[int, int]] = {}

    def read(self, task_id: int, files: int, size: int) -> None:
        with self._lock:
            told_files, told_bytes = self._told.get(task_id, (0, 0))
            self._told[task_id] = (told_files + files, told_bytes + size)
            self._progress.advance(files, size)

    def finished(self, task: RewriteTask) -> None:
        with self._lock:
            told_files, told_bytes = self._told.pop(task.task_id, (0, 0))
            self._progress.advance(
                max(len(task.inputs) - told_files, 0), max(task.input_bytes - told_bytes, 0)
            )


class _Unreadable:
    """Quarantines the unreadable files groups fail on, and gives each such group's task again
    without its file (for a delete file, without the data files it applies to) while what is
    left is worth rewriting by the plan's rules; each retry has fewer files, so it ends."""

    def __init__(
        self, plan: Plan, quarantine: Quarantine, retask: Callable[[FileGroup], RewriteTask]
    ) -> None:
        self.plan, self.quarantine, self.retask = plan, quarantine, retask

    def retry(self, group_id: int, error: UnreadableFileError) -> RewriteTask | None:
        group = self.plan.group(group_id)
        sizes = {f.path: f.size for f in group.files}
        sizes.update((d.file_path, d.file_size_in_bytes) for d in group.delete_files.values())
        self.quarantine.add(error.path, sizes.get(error.path, 0), error.reason)
        kept = [
            f
            for f in group.files
            if f.path != error.path and all(d.file_path != error.path for d in f.delete_files)
        ]
        rest = replace(group, files=kept)
        if len(kept) == len(group.files) or skip_reason(rest, self.plan.options) is not None:
            return None
        group.files = kept  # what the commit replaces
        return self.retask(group)


def _rewrite_and_commit(
    tasks: list[RewriteTask],
    executor: Executor,
    commits: CommitManager,
    progress: Progress | None,
    stop: threading.Event,
    unreadable: _Unreadable,
) -> None:
    """Run ``tasks`` on ``executor``, committing results as they come; stop all on a failure.

    The groups that failed on an unreadable file run again without it, after the others.
    """
    abort = threading.Event()  # the run failed: the other tasks stop too (``stop`` is not ours)
    token = EventToken(stop, abort)
    groups = _GroupProgress(progress) if progress else None
    while tasks:
        tasks = _rewrite_round(tasks, executor, token, abort, commits, groups, unreadable)
    commits.flush()
    commits.result.stopped = stop.is_set()


def _rewrite_round(
    tasks: list[RewriteTask],
    executor: Executor,
    token: EventToken,
    abort: threading.Event,
    commits: CommitManager,
    groups: _GroupProgress | None,
    unreadable: _Unreadable,
) -> list[RewriteTask]:
    """Run ``tasks``, committing results as they come; the tasks to run again without an
    unreadable file. Sets ``abort`` on a failure, before the running tasks are waited for."""
    if groups and isinstance(executor, ThreadExecutor):
        outcomes = executor.run(tasks, token, on_read=groups.read)
    else:  # other executors report a group once it finishes
        outcomes = executor.run(tasks, token)
    retries = []
    try:
        for task, outcome in outcomes:
            if isinstance(outcome, TaskResult):
                if groups:
                    groups.finished(task)
                grown = grown_group(task, outcome)
                if grown is None:
                    commits.add(outcome)
                else:
                    commits.leave(grown)
            elif isinstance(outcome, TaskCancelled):
                commits.fail(task.task_id, CANCELLED, outcome)
            elif isinstance(outcome, UnreadableFileError):
                retry = unreadable.retry(task.task_id, outcome)
                commits.skip(task.task_id, outcome, retried=retry is not None)
                retries += [retry] if retry is not None else []
            elif commits.options.partial_progress and isinstance(outcome, CompactorError):
                commits.fail(task.task_id, ERROR, outcome)
            else:
                raise outcome
    except BaseException:
        abort.set()
        raise
    finally:
        close = getattr(outcomes, "close", None)  # a generator: returns once no task runs
        if close is not None:
            close()
    return retries


def last_unreadable_files(table: Table) -> list[str]:
    """The unreadable files the last compaction committed on ``table``'s main branch skipped.

    Read from that snapshot's summary (:data:`UNREADABLE_FILES_PROPERTY`): no file is opened.
    """
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        properties = snapshot.summary.additional_properties if snapshot.summary else {}
        if SNAPSHOT_PROPERTY_RUN_ID in properties and SNAPSHOT_PROPERTY_ACTION not in properties:
            return list(json.loads(properties.get(UNREADABLE_FILES_PROPERTY, "[]")))
    return []


def plan_compaction(
    table: Table,
    options: PlanOptions,
    grown_before: Collection[frozenset[str]] = (),
    quarantine: Quarantine | None = None,
) -> tuple[Plan, CommitContext, Quarantine]:
    """Plan the compaction of ``table`` as every run plans it: without the files of its
    quarantine (loaded unless given), which the result also returns."""
    quarantine = quarantine or Quarantine.load(table)
    plan, context = plan_rewrite(
        table, identifier_of(table), options, grown_before, quarantine.excluded
    )
    return plan, context, quarantine


def backed_off(table: Table, options: RewriteOptions, reason: str) -> RunResult:
    """The result of a run that backed off because another run holds ``table``: what it would
    have rewritten, nothing committed."""
    plan, _, quarantine = plan_compaction(table, options.plan)
    return RunResult(
        plan.table, plan, new_run_id(), quarantined_files=quarantine.files, backed_off=reason
    )


def compact_table(
    table: Table,
    options: RewriteOptions,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    executor: Executor | None = None,
    grown_before: Collection[frozenset[str]] = (),
) -> RunResult:
    """Compact ``table`` per ``options``; commits nothing when dry-run or nothing helps.

    Groups are rewritten by ``executor`` (default: the one ``options.execution`` names, closed
    at the end; an executor given is the caller's to close). Raises
    :class:`compactor.commit.inflight.LeaseHeldError` when another live run holds the table. Setting
    ``stop`` ends the run early: no new group starts, running ones are abandoned at the next
    file, finished ones are committed. Groups whose inputs are in ``grown_before`` (a
    previous run's :attr:`RunResult.grown_inputs`) are not rewritten again, nor are the files
    of the table's quarantine (:mod:`compactor.quarantine`).
    """
    started = time.monotonic()
    run_id, identifier = new_run_id(), identifier_of(table)
    if dry_run:
        plan, _, quarantine = plan_compaction(table, options.plan, grown_before)
        result = RunResult(
            identifier, plan, run_id, dry_run=True, quarantined_files=quarantine.files
        )
        result.duration_s = time.monotonic() - started
        return result
    owned = executor is None
    executor = executor or make_executor(options.execution)
    try:
        result = _run(table, identifier, options, run_id, executor, progress, stop, grown_before)
    finally:
        if owned:
            executor.close()
    result.duration_s = time.monotonic() - started
    return result


def _run(
    table: Table,
    identifier: str,
    options: RewriteOptions,
    run_id: str,
    executor: Executor,
    progress: Progress | None,
    stop: threading.Event | None,
    grown_before: Collection[frozenset[str]],
) -> RunResult:
    with (
        RunScope(table, run_id, options.commit.lease_ttl_s) as scope,
        Quarantine.load(table).saving() as quarantine,
    ):
        plan, context, _ = plan_compaction(table, options.plan, grown_before, quarantine)
        result = RunResult(identifier, plan, run_id)
        if plan.groups:
            if progress:
                progress.start(plan)

            # The plan's files stay in memory until the commit: the rewrite has what is left.
            execution = options.execution.beside_plan(sum(len(g.files) for g in plan.groups))

            def tasks_of(groups: list[FileGroup]) -> list[RewriteTask]:
                of_groups = replace(plan, groups=groups)
                return plan_tasks(of_groups, run_id, table.io.properties, execution)

            commits = CommitManager(table, result, context, options.commit, scope)
            unreadable = _Unreadable(plan, quarantine, lambda group: tasks_of([group])[0])
            scope.start_writing()
            stop = stop or threading.Event()
            _rewrite_and_commit(
                tasks_of(plan.groups), executor, commits, progress, stop, unreadable
            )
    result.quarantined_files = quarantine.files
    result.recovered_files, result.commits_in_doubt = scope.recovered, scope.in_doubt
    return result
