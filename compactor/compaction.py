"""One compaction run: take the table's lease, plan, rewrite groups in parallel, commit.

Without partial progress the run is all or nothing: a failed group aborts it, and nothing is
committed. With ``commit_every`` set, finished groups are committed in batches as the run goes,
and a failed group fails alone. Either way every file the run wrote and did not commit is
deleted before it returns, and the lease's run record covers a crash.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyiceberg.table import Table

from compactor import __version__
from compactor.committer import CommitOutcome, commit_replace
from compactor.deleter import delete_files
from compactor.errors import CommitConflictError, CompactorError, first_line
from compactor.inflight import RunLease
from compactor.planner import FileGroup, InputFile, Plan, plan_rewrite
from compactor.rewriter import GroupResult, rewrite_group
from compactor.settings import SNAPSHOT_PROPERTY_TOOL, RewriteOptions

ERROR, CONFLICT, CANCELLED = "error", "conflict", "cancelled"


class Progress(Protocol):
    """Receives progress of a run (the CLI draws a bar; the daemon logs)."""

    def start(self, plan: Plan) -> None: ...
    def advance(self, input_bytes: int) -> None: ...


class RunCancelled(CompactorError):
    """The run was asked to stop before this group finished."""


@dataclass(frozen=True)
class GroupFailure:
    """A group that was not committed: ``kind`` is error, conflict or cancelled."""

    group_id: int
    kind: str
    reason: str


@dataclass
class RunResult:
    """What a run did; ``to_dict`` is the ``--json`` output."""

    table: str
    plan: Plan
    run_id: str
    dry_run: bool = False
    commits: list[CommitOutcome] = field(default_factory=list)
    failures: list[GroupFailure] = field(default_factory=list)
    recovered_files: list[str] = field(default_factory=list)
    stopped: bool = False
    duration_s: float = 0.0

    @property
    def committed(self) -> list[GroupResult]:
        return [r for c in self.commits for r in c.committed]

    @property
    def snapshot_ids(self) -> list[int]:
        return [c.snapshot_id for c in self.commits if c.snapshot_id is not None]

    @property
    def errors(self) -> list[GroupFailure]:
        return [f for f in self.failures if f.kind == ERROR]

    def to_dict(self) -> dict[str, Any]:
        committed = self.committed
        rewritten = [f for r in committed for f in r.group.files]
        added = [d for r in committed for d in r.data_files]
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "run_id": self.run_id,
            "start_snapshot_id": self.plan.snapshot_id,
            "snapshot_id": self.snapshot_ids[-1] if self.snapshot_ids else None,
            "snapshot_ids": self.snapshot_ids,
            "groups": len(self.plan.groups),
            "committed_groups": len(committed),
            "failed_groups": [vars(f) for f in sorted(self.failures, key=lambda f: f.group_id)],
            "rewritten_files": len(rewritten),
            "rewritten_bytes": sum(f.size for f in rewritten),
            "rewritten_delete_files": sum(len(c.removed_delete_files) for c in self.commits),
            "added_files": len(added),
            "added_bytes": sum(d.file_size_in_bytes for d in added),
            "records": sum(r.records_read for r in committed),
            "deleted_rows_applied": sum(r.rows_deleted for r in committed),
            "recovered_files": len(self.recovered_files),
            "stopped": self.stopped,
            "duration_s": round(self.duration_s, 3),
            "plan": self.plan.summary(),
        }


class _Runner:
    """Rewrites a plan's groups and commits them in batches; owns cleanup of uncommitted files."""

    def __init__(
        self,
        table: Table,
        result: RunResult,
        options: RewriteOptions,
        lease: RunLease,
        progress: Progress | None,
        stop: threading.Event,
    ) -> None:
        self.table, self.result, self.options = table, result, options
        self.plan = result.plan
        self.lease, self.progress, self.stop = lease, progress, stop
        # Set when the run fails: the other groups stop too. The caller's ``stop`` is not ours to set.
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._created: list[str] = []
        self._committed: set[str] = set()
        self._rewritten: set[str] = set()  # input files replaced by this run's commits so far
        # True while a catalog commit is under way: if it is interrupted, it may still have landed.
        self._commit_in_doubt = False
        self.undeleted: list[str] | None = None

    def run(self) -> None:
        """Run to the end; then ``undeleted`` lists files that could not be cleaned up.

        ``undeleted`` stays None if the clean-up itself could not run to its end, and when a
        commit's outcome is unknown: it may still land, so nothing is deleted and the run
        record is left for the next run, which decides once the table's state is certain.
        """
        try:
            self._rewrite_and_commit()
        finally:
            if not self._commit_in_doubt:
                leftovers = [p for p in self._created if p not in self._committed]
                self.undeleted = delete_files(self.table.io, leftovers)

    def _stopping(self) -> bool:
        return self.stop.is_set() or self._abort.is_set()

    def _on_created(self, path: str) -> None:
        self.lease.add_files([path])
        with self._lock:
            self._created.append(path)

    def _on_file_done(self, f: InputFile) -> None:
        if self.progress:
            with self._lock:
                self.progress.advance(f.size)
        if self._stopping():
            raise RunCancelled(f"table {self.plan.table}: stopped before this group finished")

    def _run_group(self, group: FileGroup) -> GroupResult:
        if self._stopping():
            raise RunCancelled(f"table {self.plan.table}: stopped before this group started")
        return rewrite_group(
            group,
            self.table.metadata,
            self.table.io,
            row_group_size=self.options.row_group_size,
            read_ahead=self.options.read_ahead,
            file_prefix=f"compactor-{self.result.run_id}-g{group.group_id:04d}",
            on_file_done=self._on_file_done,
            on_file_created=self._on_created,
        )

    def _rewrite_and_commit(self) -> None:
        batch_size = self.options.commit_batch_size(len(self.plan.groups))
        finished: list[GroupResult] = []
        with ThreadPoolExecutor(self.options.parallelism, thread_name_prefix="rewrite") as pool:
            futures: dict[Future[GroupResult], FileGroup] = {
                pool.submit(self._run_group, g): g for g in self.plan.groups
            }
            try:
                for future in as_completed(futures):
                    group, error = futures[future], future.exception()
                    if error is None:
                        finished.append(future.result())
                        if len(finished) >= batch_size:
                            self._commit(finished)
                            finished = []
                    elif isinstance(error, RunCancelled):
                        self._fail(group.group_id, CANCELLED, error)
                    elif self.options.partial_progress and isinstance(error, CompactorError):
                        self._fail(group.group_id, ERROR, error)
                    else:
                        raise error
                if finished:
                    self._commit(finished)
            except BaseException:
                self._abort.set()
                for future in futures:
                    future.cancel()
                raise
        self.result.stopped = self.stop.is_set()

    def _fail(self, group_id: int, kind: str, error: BaseException) -> None:
        self.result.failures.append(GroupFailure(group_id, kind, first_line(error)))

    def _commit(self, batch: list[GroupResult]) -> None:
        properties = {SNAPSHOT_PROPERTY_TOOL: __version__, "compactor.run-id": self.result.run_id}
        # In doubt from before the catalog call until the committed files are recorded: a
        # signal anywhere in between leaves every file in place (see ``run``).
        self._commit_in_doubt = True
        try:
            outcome = commit_replace(
                self.table,
                self.plan,
                batch,
                properties,
                on_file=self.lease.add_files,
                rewritten_before=frozenset(self._rewritten),
                fence=self.lease.verify,
            )
        except CommitConflictError as exc:
            self._commit_in_doubt = False
            if not self.options.partial_progress or self.lease.lost:
                raise
            for r in batch:
                self._fail(r.group.group_id, CONFLICT, exc)
            return
        if outcome.snapshot_id is not None:
            with self._lock:
                self._committed.update(d.file_path for r in outcome.committed for d in r.data_files)
        self._commit_in_doubt = False
        for group_id, reason in sorted(outcome.conflicts.items()):
            self.result.failures.append(GroupFailure(group_id, CONFLICT, reason))
        if outcome.snapshot_id is not None:
            self.result.commits.append(outcome)
            self._rewritten.update(f.path for r in outcome.committed for f in r.group.files)
        elif outcome.conflicts and not self.options.partial_progress:
            reasons = "; ".join(sorted(set(outcome.conflicts.values())))
            raise CommitConflictError(f"table {self.plan.table}: nothing committed: {reasons}")


def compact(
    table: Table,
    identifier: str,
    options: RewriteOptions,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
) -> RunResult:
    """Compact ``table`` per ``options``; commits nothing when dry-run or nothing helps.

    Raises :class:`compactor.inflight.LeaseHeldError` when another live run holds the table.
    Setting ``stop`` ends the run early: no new group starts, running ones are abandoned at the
    next file, finished ones are committed.
    """
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:12]
    if dry_run:
        result = RunResult(
            identifier, plan_rewrite(table, identifier, options), run_id, dry_run=True
        )
        result.duration_s = time.monotonic() - started
        return result
    lease = RunLease(table, run_id, options.lease_ttl_s)
    lease.acquire()
    runner: _Runner | None = None
    try:
        result = RunResult(identifier, plan_rewrite(table, identifier, options), run_id)
        result.recovered_files = lease.recovered
        if result.plan.groups:
            if progress:
                progress.start(result.plan)
            runner = _Runner(table, result, options, lease, progress, stop or threading.Event())
            runner.run()
    finally:
        # Keep the record, expired, while files may remain: the next run finishes the clean-up.
        if runner is not None and runner.undeleted != []:
            lease.abandon()
        else:
            lease.release()
    result.duration_s = time.monotonic() - started
    return result
