"""Committing: how many groups go in each commit, which catalog answers are refusals, how often
and how long conflicts are retried, and what a commit whose answer was lost leaves behind.

The commit loop runs against a catalog kept in memory whose answers each test scripts: no
catalog server, no database and no file is involved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pyiceberg.exceptions import (
    BadRequestError,
    CommitFailedException,
    ForbiddenError,
    NoSuchTableError,
    ServerError,
    UnauthorizedError,
)
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AddSnapshotUpdate, SetSnapshotRefUpdate, update_table_metadata
from pyiceberg.types import LongType, NestedField

from compactor.commit.committer import commit_on_branch
from compactor.commit.retry import RetryPolicy, is_refusal, is_retryable
from compactor.commit.snapshot_writer import SnapshotWriter
from compactor.errors import CommitConflictError, CommitStateUnknownError
from compactor.options import CommitOptions

# --- groups per commit -------------------------------------------------------------------------


def test_batch_size_respects_max_commits() -> None:
    assert CommitOptions(commit_every=0).commit_batch_size(12) == 12
    assert CommitOptions(commit_every=2).commit_batch_size(12) == 2
    assert CommitOptions(commit_every=1, max_commits=3).commit_batch_size(12) == 4
    assert CommitOptions(commit_every=1, max_commits=3).commit_batch_size(0) == 1


# --- which answers are refusals ----------------------------------------------------------------

STALE = "Cannot add snapshot with sequence number 7 older than last sequence number 7"


@pytest.mark.parametrize(
    ("answer", "retryable", "refusal"),
    [
        (CommitFailedException("branch main has changed"), True, True),
        (ValueError(STALE), True, True),
        (BadRequestError("first-row-id is behind table next-row-id"), True, True),
        (BadRequestError("malformed request"), False, True),
        (UnauthorizedError("token expired"), False, True),
        (ForbiddenError("not allowed"), False, True),
        (NoSuchTableError("db.t"), False, True),
        (ValueError("some other problem"), False, False),
        (ServerError("504 gateway timeout"), False, False),
        (TimeoutError("read timed out"), False, False),
        (ConnectionResetError("reset by peer"), False, False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else None,
)
def test_only_answers_that_prove_nothing_was_applied_are_refusals(
    answer: BaseException, retryable: bool, refusal: bool
) -> None:
    assert is_retryable(answer) is retryable
    assert is_refusal(answer) is refusal


def test_the_retry_policy_is_read_from_the_table_properties_and_waits_grow_to_the_maximum() -> None:
    table = _table(
        _memory_metadata(
            {
                "commit.retry.num-retries": "7",
                "commit.retry.min-wait-ms": "10",
                "commit.retry.max-wait-ms": "50",
                "commit.retry.total-timeout-ms": "-5",  # nonsense is no budget, not a negative one
            }
        )
    )
    policy = RetryPolicy.for_table(table)
    assert (policy.num_retries, policy.min_wait_ms, policy.max_wait_ms) == (7, 10, 50)
    assert policy.total_timeout_ms == 0
    # Exponential from the minimum, jittered into the upper half, never above the maximum.
    for attempt, full_ms in [(0, 10), (1, 20), (2, 40), (3, 50), (10, 50)]:
        waits = [policy.wait_s(attempt) for _ in range(50)]
        assert all(full_ms / 2000 <= wait <= full_ms / 1000 for wait in waits), (attempt, waits)
    assert RetryPolicy.for_table(_table(_memory_metadata({}))) == RetryPolicy()


# --- the commit loop ---------------------------------------------------------------------------

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))
HEAD_ID = 1
APPLY = "apply"  # the catalog takes the commit
LOST = "lost"  # the catalog takes the commit, and its answer is lost on the way back


def _memory_metadata(properties: dict[str, str]) -> TableMetadata:
    """A format 2 table with one snapshot, the head of main (its files need not exist)."""
    metadata = new_table_metadata(
        SCHEMA,
        UNPARTITIONED_PARTITION_SPEC,
        UNSORTED_SORT_ORDER,
        "file:///nowhere/db/t",
        properties,
    )
    head = _snapshot(HEAD_ID, None, 1)
    ref = SetSnapshotRefUpdate(
        ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH, snapshot_id=HEAD_ID
    )
    return update_table_metadata(metadata, (AddSnapshotUpdate(snapshot=head), ref))


def _snapshot(snapshot_id: int, parent_id: int | None, sequence_number: int) -> Snapshot:
    return Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        sequence_number=sequence_number,
        timestamp_ms=1_790_000_000_000 + sequence_number,
        manifest_list=f"file:///nowhere/db/t/metadata/snap-{snapshot_id}.avro",
        summary=Summary(operation=Operation.REPLACE),
    )


def _table(metadata: TableMetadata, catalog: Any = None) -> Table:
    return Table(("db", "t"), metadata, "memory", PyArrowFileIO(), catalog)


class MemoryCatalog:
    """One table's metadata in memory; each commit gets the next scripted answer: APPLY, LOST,
    or an exception raised without applying anything."""

    def __init__(self, answers: list[Any]) -> None:
        self.metadata = _memory_metadata({})
        self.answers = list(answers)
        self.commits = 0

    def load_table(self, identifier: Any) -> Table:
        return _table(self.metadata, self)

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> None:
        self.commits += 1
        answer = self.answers.pop(0)
        if answer in (APPLY, LOST):
            self.metadata = update_table_metadata(self.metadata, updates)
        if answer == LOST:
            raise ConnectionResetError("connection reset by peer")
        if isinstance(answer, BaseException):
            raise answer


class Journal:
    """What the loop told the run's record, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def add_files(self, paths: list[str]) -> None:
        self.events.append(("files", paths))

    def committing(self, snapshot_id: int, parent_id: int | None, branch: str) -> None:
        self.events.append(("committing", (parent_id, branch)))

    def refused(self, snapshot_id: int) -> None:
        self.events.append(("refused", snapshot_id))

    def told(self, kind: str) -> int:
        return sum(1 for event, _ in self.events if event == kind)


class Loop:
    """``commit_on_branch`` over a MemoryCatalog: every validation, build and sleep counted."""

    def __init__(self, answers: list[Any], retries: int = 4) -> None:
        self.catalog = MemoryCatalog(answers)
        self.table = self.catalog.load_table(("db", "t"))
        self.retry = RetryPolicy(num_retries=retries, min_wait_ms=100, max_wait_ms=1000)
        self.validations = 0
        self.built: list[int] = []
        self.sleeps: list[float] = []
        self.journal = Journal()

    def prepare(self) -> Snapshot | None:
        self.validations += 1
        return self.table.metadata.snapshot_by_name(MAIN_BRANCH)

    def build(self, attempt: SnapshotWriter, head: Snapshot) -> Snapshot:
        self.built.append(attempt.snapshot_id)
        sequence_number = self.table.metadata.last_sequence_number + 1
        return _snapshot(attempt.snapshot_id, head.snapshot_id, sequence_number)

    def run(self, prepare: Callable[[], Snapshot | None] | None = None) -> int | None:
        return commit_on_branch(
            self.table,
            "db.t",
            prepare or self.prepare,
            self.build,
            retry=self.retry,
            sleep=self.sleeps.append,
            journal=self.journal,
        )

    def head_id(self) -> int | None:
        head = self.catalog.metadata.snapshot_by_name(MAIN_BRANCH)
        return None if head is None else head.snapshot_id


def test_conflicts_are_validated_again_and_retried_with_growing_waits_until_the_commit_lands() -> (
    None
):
    loop = Loop([CommitFailedException("branch main has changed"), ValueError(STALE), APPLY])

    snapshot_id = loop.run()

    assert snapshot_id is not None and snapshot_id != HEAD_ID
    assert loop.head_id() == snapshot_id
    assert loop.catalog.metadata.snapshot_by_id(snapshot_id).parent_snapshot_id == HEAD_ID
    assert loop.catalog.commits == loop.validations == 3
    assert loop.built == [snapshot_id] * 3  # one snapshot id, whatever the attempt
    assert len(loop.sleeps) == 2
    assert 0.05 <= loop.sleeps[0] <= 0.1 and 0.1 <= loop.sleeps[1] <= 0.2
    # The record hears of each catalog call first, and of each refusal after it.
    assert loop.journal.told("committing") == 3 and loop.journal.told("refused") == 2
    assert loop.journal.events[-1] == ("committing", (HEAD_ID, MAIN_BRANCH))


def test_a_conflict_beyond_the_retry_budget_is_a_commit_conflict_error() -> None:
    loop = Loop([CommitFailedException("branch main has changed")] * 3, retries=2)

    with pytest.raises(CommitConflictError, match=r"^table db.t: .* after 3 attempts"):
        loop.run()

    assert loop.catalog.commits == 3 and len(loop.sleeps) == 2
    assert loop.head_id() == HEAD_ID


def test_a_refusal_that_is_no_conflict_is_raised_as_it_came_without_a_retry() -> None:
    loop = Loop([ForbiddenError("not allowed to commit")])

    with pytest.raises(ForbiddenError):
        loop.run()

    assert loop.catalog.commits == 1 and loop.sleeps == []
    assert loop.journal.told("refused") == 1  # refused for certain: its files may go
    assert loop.head_id() == HEAD_ID


@pytest.mark.parametrize(
    "answer", [ServerError("504 gateway timeout"), TimeoutError("read timed out")]
)
def test_an_answer_that_proves_nothing_is_a_commit_state_unknown_error(
    answer: Exception,
) -> None:
    loop = Loop([answer])

    with pytest.raises(CommitStateUnknownError, match="its files are kept"):
        loop.run()

    assert loop.catalog.commits == 1 and loop.sleeps == []
    assert loop.journal.told("refused") == 0  # not refused: nothing may be deleted


def test_a_commit_whose_answer_was_lost_but_which_landed_is_committed() -> None:
    loop = Loop([LOST])

    snapshot_id = loop.run()

    assert snapshot_id is not None and loop.head_id() == snapshot_id
    assert loop.catalog.commits == 1 and loop.journal.told("refused") == 0


def test_nothing_left_to_commit_makes_no_catalog_call() -> None:
    loop = Loop([])

    assert loop.run(prepare=lambda: None) is None
    assert loop.catalog.commits == 0 and loop.built == [] and loop.journal.events == []
