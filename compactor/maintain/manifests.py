"""Rewrite manifests: a snapshot's many small manifests into few, clustered by partition.

Spark's ``rewrite_manifests`` (``RewriteManifestsSparkAction``), composed of the same stages as
the other actions: inside one :class:`~compactor.commit.run_scope.RunScope` (lease, run record,
clean-up unless a commit is in doubt), :func:`~compactor.planning.manifest_groups.plan_manifest_rewrite`
groups the current snapshot's manifests by content (data, deletes) and partition spec and picks
the groups out of order, each group's live entries are read, sorted by partition and written
into manifests of about ``commit.manifest.target-size-bytes``
(:func:`~compactor.commit.manifest_commit.write_manifests`), and
:func:`~compactor.commit.manifest_commit.commit_manifest_rewrite` commits one ``replace``
snapshot that adds and removes no file, leaving out the groups a concurrent commit touched.
Every entry keeps its snapshot id and sequence numbers; what any reader reads does not change,
only how many manifests it opens to plan a scan. :class:`ManifestRewriteResult` is built from
what each stage returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pyiceberg.table import Table

from compactor.commit.committer import CommitOutcome, with_outcome
from compactor.commit.inflight import LeaseHeldError, PendingCommit
from compactor.commit.manifest_commit import (
    RewrittenManifests,
    commit_manifest_rewrite,
    manifest_count,
    write_manifests,
)
from compactor.commit.run_scope import RunScope, new_run_id
from compactor.commit.snapshot_writer import SnapshotWriter
from compactor.errors import CommitStateUnknownError
from compactor.iceberg.pyiceberg_compat import snapshot_manifests
from compactor.options.defaults import DEFAULT_LEASE_TTL_S
from compactor.options.maintenance import target_manifest_size
from compactor.planning.manifest_groups import (
    ManifestGroup,
    ManifestPlan,
    clustered_entries,
    count_by_content,
    entries_by_content,
    plan_manifest_rewrite,
)
from compactor.storage.deleter import delete_files

__all__ = ["ACTION", "ManifestRewriteResult", "rewrite_manifests"]

ACTION = "rewrite-manifests"

# Called with the number of manifests read so far and how many there are to read.
ManifestProgress = Callable[[int, int], None]


@dataclass
class ManifestRewriteResult:
    """What ``rewrite_manifests`` did (or, with ``dry_run``, would do)."""

    table: str
    run_id: str
    dry_run: bool
    target_manifest_size: int
    spec_id: int | None = None
    start_snapshot_id: int | None = None
    snapshot_id: int | None = None
    manifests_before: dict[str, int] = field(default_factory=dict)
    manifests_after: dict[str, int] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)  # live entries, by content
    # rewritten (or to be, dry run), and left alone as in order
    groups: list[RewrittenManifests] = field(default_factory=list)
    in_order: list[ManifestGroup] = field(default_factory=list)
    committed: list[RewrittenManifests] = field(default_factory=list)
    conflicts: dict[int, str] = field(default_factory=dict)  # group id -> why it was refused
    recovered_files: list[str] = field(default_factory=list)
    # Commits of abandoned runs that may still land: their files were kept.
    commits_in_doubt: list[PendingCommit] = field(default_factory=list)
    attempts: int = 0
    duration_s: float = 0.0
    backed_off: str | None = None  # why the run did not start: another run holds the table

    @property
    def _done(self) -> list[RewrittenManifests]:
        return self.groups if self.dry_run else self.committed

    @property
    def manifests_replaced(self) -> int:
        return sum(len(g.group.manifests) for g in self._done)

    @property
    def manifests_written(self) -> int:
        return sum(g.planned for g in self._done)

    @property
    def bytes_replaced(self) -> int:
        return sum(g.group.bytes for g in self._done)

    @property
    def bytes_written(self) -> int:
        return sum(g.bytes_written for g in self._done)

    @property
    def entries_rewritten(self) -> int:
        return sum(g.entries for g in self._done)

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "action": ACTION,
            "dry_run": self.dry_run,
            "run_id": self.run_id,
            "start_snapshot_id": self.start_snapshot_id,
            "snapshot_id": self.snapshot_id,
            "spec_id": self.spec_id,
            "target_manifest_size": self.target_manifest_size,
            "manifests_before": dict(self.manifests_before),
            "manifests_after": dict(self.manifests_after),
            "entries": dict(self.entries),
            "manifests_replaced": self.manifests_replaced,
            "manifests_written": self.manifests_written,
            "bytes_replaced": self.bytes_replaced,
            "bytes_written": self.bytes_written,
            "entries_rewritten": self.entries_rewritten,
            "groups": [g.summary() for g in self.groups],
            "groups_in_order": len(self.in_order),
            "committed_groups": len(self.committed),
            "conflicts": [
                {"group_id": gid, "reason": reason}
                for gid, reason in sorted(self.conflicts.items())
            ],
            "recovered_files": len(self.recovered_files),
            "commits_in_doubt": [c.to_dict() for c in self.commits_in_doubt],
            "attempts": self.attempts,
            "backed_off": self.backed_off,
            "duration_ms": round(self.duration_s * 1000),
        }


def rewrite_manifests(
    table: Table,
    identifier: str,
    *,
    spec_id: int | None = None,
    target_size: int | str | None = None,
    dry_run: bool = False,
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    run_id: str | None = None,
    progress: ManifestProgress | None = None,
) -> ManifestRewriteResult:
    """Rewrite the manifests of ``table``'s current snapshot that are out of order.

    ``target_size`` (default: the table's ``commit.manifest.target-size-bytes``, else 8 MiB)
    is the size manifests are written at; ``spec_id`` limits the rewrite to one partition
    spec's manifests. ``dry_run`` reads the manifests to rewrite and reports what would change,
    writing nothing. ``progress(read, total)`` is called as manifests are read.

    Raises :class:`CommitStateUnknownError` when the catalog cannot tell whether the commit
    landed (every file is kept for the next run), :class:`CommitConflictError` when the commit
    still conflicts after the table's retries. Groups refused because of a concurrent commit
    are reported in ``result.conflicts``; when a live run holds the table nothing is done and
    ``result.backed_off`` says why.
    """
    started = time.monotonic()
    target = target_manifest_size(table.metadata.properties, target_size)
    run_id = run_id or new_run_id()
    if dry_run:
        plan = plan_manifest_rewrite(table, target, spec_id)
        measured = _rewrite(table, plan, None, progress)
        result = _result(identifier, run_id, True, spec_id, plan, measured, None)
        return replace(
            result,
            manifests_after=_predicted_after(result),
            duration_s=time.monotonic() - started,
        )

    try:
        with RunScope(table, run_id, lease_ttl_s) as scope:
            plan = plan_manifest_rewrite(table, target, spec_id)
            rewritten: list[RewrittenManifests] = []
            outcome = None
            if plan.groups:
                scope.start_writing()
                writer = SnapshotWriter(
                    table, table.metadata.new_snapshot_id(), scope.journal.add_files
                )
                try:
                    rewritten = _rewrite(table, plan, writer, progress)
                except BaseException:
                    writer.discard()
                    raise
                outcome = _commit(table, identifier, plan, rewritten, writer, scope)
            committed = outcome is not None and outcome.snapshot_id is not None
            after = _current_counts(table) if committed else dict(_counts(plan))
    except LeaseHeldError as exc:  # nothing done: say why, as `compactor run` does
        return ManifestRewriteResult(
            identifier,
            run_id,
            dry_run,
            target,
            spec_id,
            backed_off=str(exc),
            duration_s=time.monotonic() - started,
        )
    return replace(
        _result(identifier, run_id, False, spec_id, plan, rewritten, outcome),
        manifests_after=after,
        recovered_files=scope.recovered,
        commits_in_doubt=scope.in_doubt,
        duration_s=time.monotonic() - started,
    )


def _rewrite(
    table: Table,
    plan: ManifestPlan,
    writer: SnapshotWriter | None,
    progress: ManifestProgress | None,
) -> list[RewrittenManifests]:
    """Read each group's entries clustered by partition and write them (``writer``), or only
    count the manifests they would fill (None: a dry run). One group's entries at a time."""
    total = sum(len(g.manifests) for g in plan.groups)
    read = 0

    def one_read() -> None:
        nonlocal read
        read += 1
        if progress is not None:
            progress(read, total)

    rewritten = []
    for group in plan.groups:
        entries = clustered_entries(table, group, one_read)
        count = manifest_count(table, group, entries, plan.target_size)
        outputs = () if writer is None else tuple(write_manifests(writer, group, entries, count))
        rewritten.append(RewrittenManifests(group, len(entries), count, outputs))
    return rewritten


def _commit(
    table: Table,
    identifier: str,
    plan: ManifestPlan,
    rewritten: list[RewrittenManifests],
    writer: SnapshotWriter,
    scope: RunScope,
) -> CommitOutcome[RewrittenManifests]:
    """Commit ``rewritten``; delete the manifests of the groups not committed, unless the
    commit is in doubt (then the run record keeps them for the next run to settle)."""
    try:
        with scope.committing():
            outcome = commit_manifest_rewrite(
                table,
                identifier,
                plan,
                rewritten,
                writer.snapshot_id,
                scope.snapshot_properties(ACTION),
                journal=scope.journal,
            )
            scope.keep(m.manifest_path for g in outcome.committed for m in g.outputs)
    except CommitStateUnknownError:
        raise
    except Exception:
        writer.discard()
        raise
    refused = [
        m.manifest_path for g in rewritten if g.group_id in outcome.conflicts for m in g.outputs
    ]
    delete_files(table.io, refused)
    return outcome


def _counts(plan: ManifestPlan) -> dict[str, int]:
    return count_by_content(plan.manifests)


def _current_counts(table: Table) -> dict[str, int]:
    snapshot = table.current_snapshot()
    if snapshot is None:
        return count_by_content([])
    return count_by_content(snapshot_manifests(table.io, snapshot, table.metadata.format_version))


def _result(
    identifier: str,
    run_id: str,
    dry_run: bool,
    spec_id: int | None,
    plan: ManifestPlan,
    rewritten: list[RewrittenManifests],
    outcome: CommitOutcome[RewrittenManifests] | None,
) -> ManifestRewriteResult:
    """The result of a plan, its rewritten groups and, unless none was made, the commit."""
    result = ManifestRewriteResult(
        identifier,
        run_id,
        dry_run,
        plan.target_size,
        spec_id,
        start_snapshot_id=plan.snapshot_id,
        manifests_before=_counts(plan),
        entries=entries_by_content(plan.manifests),
        groups=rewritten,
        in_order=list(plan.in_order),
    )
    return with_outcome(result, outcome)


def _predicted_after(result: ManifestRewriteResult) -> dict[str, int]:
    after = dict(result.manifests_before)
    for g in result.groups:
        after[g.group.content_name] += g.planned - len(g.group.manifests)
    return after
