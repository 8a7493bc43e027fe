"""Rewrite delete files: convert equality deletes, merge each partition's position deletes into
one, drop dangling rows.

Inside one :class:`~compactor.commit.run_scope.RunScope` (lease, run record, intent files,
clean-up unless a commit is in doubt): first the equality deletes are converted into position
deletes (deletion vectors on format 3, where nothing else is done) by reading the key columns
of the data files they apply to (:mod:`compactor.maintain.delete_conversion`, one ``replace``
snapshot); then, on format 2, Iceberg Java's
``rewrite_position_delete_files`` with remove-dangling-deletes, composed of the same stages as
a compaction run (:mod:`compactor.compaction`):
:func:`~compactor.planning.delete_groups.plan_delete_rewrite`
groups the position delete files of the branch's head by (spec id, partition),
:func:`~compactor.rewrite.position_deletes.rewrite_delete_group` keeps each group's rows that
still apply to a live data file and writes them into new files (``compactor-<run id>-...``,
rolling at the target size), and :func:`~compactor.commit.delete_commit.commit_delete_rewrite`
commits one ``replace`` snapshot, leaving out the groups a concurrent commit touched. What a
reader deletes does not change. :class:`DeleteRewriteResult` is built from what each stage
returned.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot

from compactor.commit.committer import with_outcome
from compactor.commit.delete_commit import DeleteCommitOutcome, commit_delete_rewrite
from compactor.commit.inflight import LeaseHeldError, PendingCommit
from compactor.commit.run_scope import RunScope, new_run_id
from compactor.errors import UnsupportedTableError
from compactor.maintain import delete_conversion
from compactor.maintain.delete_conversion import EqualityConversionResult
from compactor.options.compact import parse_memory_limit
from compactor.options.defaults import DEFAULT_LEASE_TTL_S
from compactor.options.maintenance import delete_target_file_size
from compactor.planning.delete_groups import (
    DeletePlan,
    RewrittenDeleteGroup,
    count_delete_files,
    plan_delete_rewrite,
)
from compactor.planning.planner import branch_head, parse_where
from compactor.rewrite.position_deletes import (
    OTHER_PARTITION,
    SHARED_PATH,
    SINGLE_FILE,
    rewrite_delete_group,
)

__all__ = [
    "ACTION",
    "CONVERTED",
    "OTHER_PARTITION",
    "SHARED_PATH",
    "SINGLE_FILE",
    "DeleteRewriteResult",
    "commit_delete_rewrite",
    "rewrite_position_deletes",
]

ACTION = "rewrite-position-deletes"
# Why a partition's position deletes are left alone: they are the files the conversion just
# wrote (sorted, unique, naming live data files only, rolled at the target size already).
CONVERTED = "position_deletes_the_conversion_just_wrote"


@dataclass
class DeleteRewriteResult:
    """What ``rewrite_position_deletes`` did (or, with ``dry_run``, would do)."""

    table: str
    run_id: str
    dry_run: bool
    target_file_size: int
    start_snapshot_id: int | None = None
    snapshot_id: int | None = None
    delete_files_before: dict[str, int] = field(default_factory=dict)
    delete_files_after: dict[str, int] = field(default_factory=dict)
    # rewritten (or to be, dry run)
    groups: list[RewrittenDeleteGroup] = field(default_factory=list)
    committed: list[RewrittenDeleteGroup] = field(default_factory=list)
    conflicts: dict[int, str] = field(default_factory=dict)  # group id -> why it was refused
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> partitions left alone
    recovered_files: list[str] = field(default_factory=list)
    # Commits of abandoned runs that may still land: their files were kept.
    commits_in_doubt: list[PendingCommit] = field(default_factory=list)
    attempts: int = 0
    duration_s: float = 0.0
    backed_off: str | None = None  # why the run did not start: another run holds the table
    # The conversion of equality deletes that ran first (None: not asked for).
    equality_conversion: EqualityConversionResult | None = None

    @property
    def _done(self) -> list[RewrittenDeleteGroup]:
        return self.groups if self.dry_run else self.committed

    @property
    def files_removed(self) -> int:
        return sum(len(g.entries) for g in self._done)

    @property
    def files_added(self) -> int:
        return sum(g.expected_output_files(self.target_file_size) for g in self._done)

    @property
    def bytes_removed(self) -> int:
        return sum(d.file_size_in_bytes for g in self._done for d in g.delete_files)

    @property
    def bytes_added(self) -> int:
        return sum(d.file_size_in_bytes for g in self._done for d in g.outputs)

    @property
    def dangling_rows_dropped(self) -> int:
        return sum(g.dangling_rows for g in self._done)

    def to_dict(self) -> dict[str, Any]:
        done = self._done
        return {
            "table": self.table,
            "action": ACTION,
            "dry_run": self.dry_run,
            "run_id": self.run_id,
            "start_snapshot_id": self.start_snapshot_id,
            "snapshot_id": self.snapshot_id,
            "target_file_size": self.target_file_size,
            "delete_files_before": dict(self.delete_files_before),
            "delete_files_after": dict(self.delete_files_after),
            "files_removed": self.files_removed,
            "files_added": self.files_added,
            "bytes_removed": self.bytes_removed,
            "bytes_added": self.bytes_added,
            "rows_read": sum(g.rows_read for g in done),
            "rows_written": sum(g.rows_written for g in done),
            "dangling_rows_dropped": self.dangling_rows_dropped,
            "duplicate_rows_dropped": sum(g.duplicate_rows for g in done),
            "groups": [g.summary(self.target_file_size) for g in self.groups],
            "committed_groups": len(self.committed),
            "conflicts": [
                {"group_id": gid, "reason": reason}
                for gid, reason in sorted(self.conflicts.items())
            ],
            "skipped": dict(self.skipped),
            "recovered_files": len(self.recovered_files),
            "commits_in_doubt": [c.to_dict() for c in self.commits_in_doubt],
            "attempts": self.attempts,
            "backed_off": self.backed_off,
            "duration_ms": round(self.duration_s * 1000),
            "equality_conversion": (
                None if self.equality_conversion is None else self.equality_conversion.to_dict()
            ),
        }

    @property
    def changed(self) -> bool:
        """Whether a snapshot was committed (or, dry run, would be)."""
        conversion = self.equality_conversion
        converted = conversion is not None and bool(conversion.equality_delete_files_converted)
        return bool(self.files_removed) or converted


def rewrite_position_deletes(
    table: Table,
    identifier: str,
    *,
    target_file_size: int | str | None = None,
    dry_run: bool = False,
    where: str | None = None,
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    run_id: str | None = None,
    convert_equality_deletes: bool = True,
    branch: str = MAIN_BRANCH,
    memory_limit: int | str | None = None,
) -> DeleteRewriteResult:
    """Rewrite the delete files of the head of ``table``'s ``branch``, partition by partition,
    committing to that branch (other branches, tags and main stay as they are).

    With ``convert_equality_deletes``, equality deletes are first converted into position
    deletes (one snapshot, ``result.equality_conversion``), reading only the key columns of the
    data files they apply to; then the position delete files, those just written included, are
    rewritten (one more snapshot).

    ``target_file_size`` (default: the table's ``write.delete.target-file-size-bytes``, else
    64 MiB) is where a new delete file rolls over; ``memory_limit`` (default 384 MiB) bounds
    what the conversion holds at once; ``where`` limits the rewrite to the
    partitions a row filter may touch (partition values only: a delete file is never split).
    ``dry_run`` reads the position delete files and plans the conversion, writing nothing.

    On format version 3 the equality deletes become deletion vectors and deletion vectors are
    not compacted. Raises :class:`UsageError` when ``branch`` is not a branch of the table,
    :class:`UnsupportedTableError` for a format-3 table without equality
    deletes to convert (or with ``convert_equality_deletes`` off),
    :class:`CommitStateUnknownError` when the catalog cannot tell whether the commit landed
    (every file is kept for the next run), :class:`DataFileError` for an unreadable delete file.
    Partitions refused because of a concurrent commit are reported in ``result.conflicts``;
    when a live run holds the table nothing is done and ``result.backed_off`` says why.
    """
    started = time.monotonic()
    metadata = table.metadata
    deletion_vectors = metadata.format_version > 2
    head = branch_head(table, identifier, branch)
    if deletion_vectors and not (convert_equality_deletes and _has_equality_deletes(table, head)):
        raise UnsupportedTableError(
            f"table {identifier}: format version {metadata.format_version} keeps position "
            "deletes as deletion vectors (one per data file), which rewrite-deletes does not "
            "merge; `compactor run` applies them and removes them with the files it rewrites "
            "(rewrite-deletes only converts equality deletes there, and the table has none)"
        )
    target = delete_target_file_size(table.metadata.properties, target_file_size)
    limit = parse_memory_limit(memory_limit)
    row_filter = parse_where(table, where)
    run_id = run_id or new_run_id()
    if dry_run:
        conversion = (
            delete_conversion.plan_conversion(table, identifier, row_filter, branch)
            if convert_equality_deletes
            else None
        )
        plan = _position_plan(table, identifier, row_filter, deletion_vectors, branch)
        rewritten = [
            rewrite_delete_group(table, identifier, group, plan.live, target, None)
            for group in plan.groups
        ]
        result = _result(identifier, run_id, True, target, plan, rewritten, None)
        result.equality_conversion = conversion
        return replace(
            result,
            delete_files_after=_predicted_after(result),
            duration_s=time.monotonic() - started,
        )

    try:
        with RunScope(table, run_id, lease_ttl_s) as scope:
            conversion = None
            if convert_equality_deletes:
                conversion = delete_conversion.convert_equality_deletes(
                    table, identifier, row_filter, target, scope, branch, limit
                )
            # After the conversion.
            plan = _position_plan(table, identifier, row_filter, deletion_vectors, branch)
            scope.start_writing()
            converted = _written_by(conversion)
            rewritten = [
                RewrittenDeleteGroup.of(group, skipped=CONVERTED)
                if group.paths <= converted
                else rewrite_delete_group(table, identifier, group, plan.live, target, run_id)
                for group in plan.groups
            ]
            groups = [g for g in rewritten if g.skipped is None]
            outcome = None
            if groups:
                with scope.committing():
                    outcome = commit_delete_rewrite(
                        table,
                        identifier,
                        plan.snapshot_id,
                        plan.start_manifests,
                        groups,
                        scope.snapshot_properties(ACTION),
                        journal=scope.journal,
                        branch=branch,
                    )
                    scope.keep(d.file_path for g in outcome.committed for d in g.outputs)
            after = (
                count_delete_files(table, table.metadata.snapshot_by_name(branch))
                if outcome is not None
                else dict(plan.delete_files)
            )
    except LeaseHeldError as exc:  # nothing done: say why, as `compactor run` does
        return DeleteRewriteResult(
            identifier,
            run_id,
            dry_run,
            target,
            backed_off=str(exc),
            duration_s=time.monotonic() - started,
        )
    result = replace(
        _result(identifier, run_id, False, target, plan, rewritten, outcome),
        delete_files_after=after,
        recovered_files=scope.recovered,
        commits_in_doubt=scope.in_doubt,
        duration_s=time.monotonic() - started,
        equality_conversion=conversion,
    )
    if conversion is not None and conversion.plan.snapshot_id is not None:
        # Planned, and delete files counted, before the conversion.
        result.start_snapshot_id = conversion.plan.snapshot_id
        result.delete_files_before = dict(conversion.plan.delete_files)
        if result.snapshot_id is None:
            result.snapshot_id = conversion.snapshot_id
    return result


def _written_by(conversion: EqualityConversionResult | None) -> set[str]:
    """The position delete files ``conversion`` committed (paths)."""
    if conversion is None or conversion.snapshot_id is None:
        return set()
    return {d.file_path for g in conversion.committed for d in g.output_files}


def _has_equality_deletes(table: Table, snapshot: Snapshot | None) -> bool:
    """Whether ``snapshot`` (a branch head) has equality deletes: by its summary's total when it
    has one (no manifest read), else by its delete manifests."""
    if snapshot is None:
        return False
    total = snapshot.summary.get("total-equality-deletes") if snapshot.summary else None
    if total is not None:
        return int(total) > 0
    return count_delete_files(table, snapshot)["equality"] > 0


def _position_plan(
    table: Table,
    identifier: str,
    row_filter: BooleanExpression,
    deletion_vectors: bool,
    branch: str,
) -> DeletePlan:
    """The position deletes of ``branch``'s head to rewrite; none where they are deletion
    vectors (format 3)."""
    if not deletion_vectors:
        return plan_delete_rewrite(table, identifier, row_filter, branch)
    snapshot = branch_head(table, identifier, branch)
    return DeletePlan(
        snapshot_id=snapshot.snapshot_id if snapshot else None,
        branch=branch,
        delete_files=count_delete_files(table, snapshot),
    )


def _result(
    identifier: str,
    run_id: str,
    dry_run: bool,
    target_file_size: int,
    plan: DeletePlan,
    rewritten: Iterable[RewrittenDeleteGroup],
    outcome: DeleteCommitOutcome | None,
) -> DeleteRewriteResult:
    """The result of a plan, its rewritten groups and, unless none was made, the commit."""
    rewritten = list(rewritten)
    result = DeleteRewriteResult(
        identifier,
        run_id,
        dry_run,
        target_file_size,
        start_snapshot_id=plan.snapshot_id,
        delete_files_before=dict(plan.delete_files),
        groups=[g for g in rewritten if g.skipped is None],
        skipped=dict(Counter(g.skipped for g in rewritten if g.skipped is not None)),
    )
    return with_outcome(result, outcome)


def _predicted_after(result: DeleteRewriteResult) -> dict[str, int]:
    """The delete files after a run, as a dry run predicts them (the conversion's position
    delete files are not known until key columns are read: not counted)."""
    after = Counter(result.delete_files_before)
    after["position"] += result.files_added - result.files_removed
    if result.equality_conversion is not None:
        after["equality"] -= result.equality_conversion.equality_delete_files_converted
    return dict(after)
