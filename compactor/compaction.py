"""One compaction run: plan, rewrite groups in parallel, commit one ``replace`` snapshot."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyiceberg.table import Table

from compactor import __version__
from compactor.committer import CommitOutcome, commit_replace
from compactor.errors import CommitConflictError, CompactorError
from compactor.planner import FileGroup, InputFile, Plan, plan_rewrite
from compactor.rewriter import GroupResult, delete_files, rewrite_group
from compactor.settings import SNAPSHOT_PROPERTY_TOOL, RewriteOptions


class Progress(Protocol):
    """Receives progress of a run (the CLI draws a bar; the daemon logs)."""

    def start(self, plan: Plan) -> None: ...
    def advance(self, input_bytes: int) -> None: ...


class RunCancelled(CompactorError):
    """The run was interrupted; nothing was committed."""


@dataclass
class RunResult:
    """What a run did; ``to_dict`` is the ``--json`` output."""

    table: str
    plan: Plan
    dry_run: bool = False
    outcome: CommitOutcome | None = None
    duration_s: float = 0.0
    run_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def committed(self) -> list[GroupResult]:
        return self.outcome.committed if self.outcome else []

    def to_dict(self) -> dict[str, Any]:
        committed = self.committed
        rewritten = [f for r in committed for f in r.group.files]
        added = [d for r in committed for d in r.data_files]
        conflicts = self.outcome.conflicts if self.outcome else {}
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "run_id": self.run_id,
            "start_snapshot_id": self.plan.snapshot_id,
            "snapshot_id": self.outcome.snapshot_id if self.outcome else None,
            "groups": len(self.plan.groups),
            "committed_groups": len(committed),
            "failed_groups": [
                {"group_id": gid, "reason": why} for gid, why in sorted(conflicts.items())
            ],
            "rewritten_files": len(rewritten),
            "rewritten_bytes": sum(f.size for f in rewritten),
            "rewritten_delete_files": len(self.outcome.removed_delete_files) if self.outcome else 0,
            "added_files": len(added),
            "added_bytes": sum(d.file_size_in_bytes for d in added),
            "records": sum(r.records_read for r in committed),
            "deleted_rows_applied": sum(r.rows_deleted for r in committed),
            "duration_s": round(self.duration_s, 3),
            "plan": self.plan.summary(),
        }


def _file_prefix(run_id: str, group: FileGroup) -> str:
    return f"compactor-{run_id}-g{group.group_id:04d}"


def compact(
    table: Table,
    identifier: str,
    options: RewriteOptions,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> RunResult:
    """Compact ``table`` per ``options``. Commits nothing when dry-run or nothing helps.

    Any group failure aborts the run: every file it wrote is deleted and nothing is committed.
    """
    started = time.monotonic()
    plan = plan_rewrite(table, identifier, options)
    run_id = uuid.uuid4().hex[:12]
    result = RunResult(identifier, plan, dry_run=dry_run, run_id=run_id)
    if dry_run or not plan.groups:
        result.duration_s = time.monotonic() - started
        return result
    if progress:
        progress.start(plan)

    created: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def on_created(path: str) -> None:
        with lock:
            created.append(path)

    def on_file_done(f: InputFile) -> None:
        if progress:
            with lock:
                progress.advance(f.size)
        if stop.is_set():
            raise RunCancelled(f"table {identifier}: run cancelled")

    metadata, io = table.metadata, table.io

    def run_group(group: FileGroup) -> GroupResult:
        if stop.is_set():
            raise RunCancelled(f"table {identifier}: run cancelled")
        return rewrite_group(
            group,
            metadata,
            io,
            row_group_size=options.row_group_size,
            read_ahead=options.read_ahead,
            file_prefix=_file_prefix(run_id, group),
            on_file_done=on_file_done,
            on_file_created=on_created,
        )

    committed_ok = False
    try:
        with ThreadPoolExecutor(options.parallelism, thread_name_prefix="rewrite") as pool:
            futures: list[Future[GroupResult]] = [pool.submit(run_group, g) for g in plan.groups]
            try:
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failed = [f for f in done if f.exception() is not None]
                if failed:
                    stop.set()
                    for f in futures:
                        f.cancel()
                    raise failed[0].exception()  # type: ignore[misc]
            except BaseException:
                stop.set()
                for f in futures:
                    f.cancel()
                raise
            results = [f.result() for f in futures]
        properties = {SNAPSHOT_PROPERTY_TOOL: __version__, "compactor.run-id": run_id}
        outcome = commit_replace(table, plan, results, properties)
        result.outcome = outcome
        committed_ok = outcome.snapshot_id is not None
        refused = {gid for gid in outcome.conflicts}
        delete_files(
            io, [d.file_path for r in results if r.group.group_id in refused for d in r.data_files]
        )
        if not committed_ok and outcome.conflicts:
            reasons = "; ".join(sorted(set(outcome.conflicts.values())))
            raise CommitConflictError(f"table {identifier}: nothing committed: {reasons}")
    finally:
        if not committed_ok:
            delete_files(io, created)
        result.duration_s = time.monotonic() - started
    return result
