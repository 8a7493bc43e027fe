"""Convert equality deletes into position deletes, without rewriting a data file.

The first step of ``compactor rewrite-deletes``, inside its run scope, from the same stages as
every rewrite: :func:`~compactor.planning.equality_groups.plan_equality_conversion` finds, per
partition, the data files each equality delete applies to (the spec's rules, as the data-file
planner applies them); :func:`~compactor.rewrite.equality_conversion.convert_equality_group`
reads only their key columns and writes the positions of the rows the deletes delete as
position delete files of the partition; and
:func:`~compactor.commit.equality_commit.commit_equality_conversion` commits one ``replace``
snapshot adding them and removing the equality delete files, leaving out the partitions a
concurrent commit changed. Readers delete exactly the rows they deleted before.
:class:`EqualityConversionResult` is built from what each stage returned.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH

from compactor.commit.equality_commit import commit_equality_conversion
from compactor.commit.run_scope import RunScope
from compactor.options.defaults import DEFAULT_MEMORY_LIMIT
from compactor.planning.equality_groups import EqualityPlan, plan_equality_conversion
from compactor.rewrite.equality_conversion import ConvertedGroup, convert_equality_group

ACTION = "convert-equality-deletes"


@dataclass
class EqualityConversionResult:
    """What converting equality deletes did (or, ``dry_run``, would do: planned, not read)."""

    dry_run: bool
    plan: EqualityPlan = field(default_factory=EqualityPlan)
    groups: list[ConvertedGroup] = field(default_factory=list)
    committed: list[ConvertedGroup] = field(default_factory=list)
    conflicts: dict[int, str] = field(default_factory=dict)  # group id -> why it was refused
    global_deletes_removed: int = 0
    snapshot_id: int | None = None
    attempts: int = 0
    duration_s: float = 0.0

    @property
    def equality_delete_files_converted(self) -> int:
        """Equality delete files removed (dry run: that would be)."""
        if self.dry_run:
            return self.plan.equality_deletes
        return sum(len(g.equality_deletes) for g in self.committed) + self.global_deletes_removed

    @property
    def position_delete_files_written(self) -> int | None:
        """Position delete files committed (dry run: None, known once key columns are read)."""
        if self.dry_run:
            return None
        return sum(len(g.outputs) - g.deletion_vectors for g in self.committed)

    @property
    def deletion_vectors_written(self) -> int | None:
        """Deletion vectors committed (format 3; dry run: None)."""
        if self.dry_run:
            return None
        return sum(g.deletion_vectors for g in self.committed)

    @property
    def skipped(self) -> dict[str, int]:
        """Equality delete files left alone, by reason: by the plan, or with their group."""
        skipped = Counter(self.plan.skipped)
        for g in self.groups:
            if g.skipped is not None:
                skipped[g.skipped] += len(g.equality_deletes)
        return dict(skipped)

    @property
    def rows_matched(self) -> int | None:
        if self.dry_run:
            return None
        return sum(g.rows_matched for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        return {
            "snapshot_id": self.snapshot_id,
            "equality_delete_files_converted": self.equality_delete_files_converted,
            "position_delete_files_written": self.position_delete_files_written,
            "deletion_vectors_written": self.deletion_vectors_written,
            "data_files_read": sum(len(g.inputs) for g in self.groups),
            "key_bytes_read": sum(g.key_bytes for g in self.groups),
            "rows_matched": self.rows_matched,
            "groups": [g.summary() for g in self.groups],
            "committed_groups": len(self.committed),
            "conflicts": [
                {"group_id": gid, "reason": reason}
                for gid, reason in sorted(self.conflicts.items())
            ],
            "skipped": self.skipped,
            "attempts": self.attempts,
            "duration_ms": round(self.duration_s * 1000),
        }


def plan_conversion(
    table: Table, identifier: str, row_filter: BooleanExpression, branch: str = MAIN_BRANCH
) -> EqualityConversionResult:
    """What a conversion of ``branch``'s head would do: the plan, nothing read or written."""
    started = time.monotonic()
    plan = plan_equality_conversion(table, identifier, row_filter, branch)
    return EqualityConversionResult(
        dry_run=True,
        plan=plan,
        groups=[ConvertedGroup.of(g) for g in plan.groups],
        duration_s=time.monotonic() - started,
    )


def convert_equality_deletes(
    table: Table,
    identifier: str,
    row_filter: BooleanExpression,
    target_file_size: int,
    scope: RunScope,
    branch: str = MAIN_BRANCH,
    memory_limit: int = DEFAULT_MEMORY_LIMIT,
) -> EqualityConversionResult:
    """Convert the equality deletes of the partitions ``row_filter`` may touch at the head of
    ``branch``, committing one snapshot on it for run ``scope`` (whose clean-up deletes the
    outputs of refused groups), holding about ``memory_limit`` bytes at most."""
    started = time.monotonic()
    plan = plan_equality_conversion(table, identifier, row_filter, branch)
    result = EqualityConversionResult(dry_run=False, plan=plan)
    if not plan.groups and not plan.global_deletes:
        result.duration_s = time.monotonic() - started
        return result
    scope.start_writing()
    result.groups = [
        convert_equality_group(table, g, plan.live, target_file_size, scope.run_id, memory_limit)
        for g in plan.groups
    ]
    converted = [g for g in result.groups if g.skipped is None]
    if not converted:
        result.duration_s = time.monotonic() - started
        return result
    with scope.committing():
        outcome = commit_equality_conversion(
            table,
            identifier,
            plan,
            converted,
            scope.snapshot_properties(ACTION),
            journal=scope.journal,
        )
        scope.keep(d.file_path for g in outcome.committed for d in g.output_files)
    result.snapshot_id = outcome.snapshot_id
    result.committed = outcome.committed if outcome.snapshot_id is not None else []
    result.conflicts = outcome.conflicts
    if outcome.snapshot_id is not None:
        result.global_deletes_removed = len(outcome.removed_delete_files)
    result.attempts = outcome.attempts
    result.duration_s = time.monotonic() - started
    return result
