"""``--branch``: compact a branch's head and commit to that branch; main and tags stay put.

Each test ends with Iceberg Java reading every ref (the branch, main, tags) with the same rows
as pyiceberg. A branch compaction also runs on main's files imported without field ids (read
through the table's name mapping), which the branch shares with main.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from compactor import compaction
from compactor.bench.sample import create_events_table, events_batch
from compactor.commit.committer import commit_replace
from compactor.errors import UsageError
from compactor.options import resolve_options

from support.cli import compactor as compactor_cli
from support.cli import embedded
from support.java_reader import assert_java_reads_same
from support.rows import assert_same_rows
from support.runs import DEFAULT_OPTIONS
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    append_rows,
    events_table,
    files_without_field_ids,
    live_data_files,
    unmapped_snapshots,
)

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")

TABLE, BRANCH = "db.events", "audit"


@pytest.fixture
def events(catalog: Catalog) -> Table:
    """Main: 3 commits; branch ``audit`` from there, 3 more commits of its own; main 2 more.

    Main's commits are appended with :func:`support.tables.append_rows`, which appends to main
    only: the branch's own are files with field ids.
    """
    table = events_table(catalog, TABLE, commits=3, rows_per_commit=480)
    head = table.current_snapshot()
    assert head is not None
    table.manage_snapshots().create_branch(head.snapshot_id, BRANCH).commit()
    for commit in range(10, 13):
        table.append(events_batch(commit=commit, rows=480, days=3), branch=BRANCH)
    for commit in range(20, 22):
        append_rows(table, events_batch(commit=commit, rows=480, days=3))
    return catalog.load_table(TABLE)


def _head(table: Table, ref: str) -> int:
    snapshot = table.snapshot_by_name(ref)
    assert snapshot is not None
    return snapshot.snapshot_id


def _rows(table: Table, ref: str) -> pa.Table:
    return table.scan(snapshot_id=_head(table, ref)).to_arrow()


def _compact(
    catalog: Catalog, concurrent: Callable[[Table], None] | None = None, **options: object
) -> compaction.RunResult:
    table = catalog.load_table(TABLE)
    resolved = resolve_options(
        TABLE, table.metadata.properties, **{**DEFAULT_OPTIONS, "branch": BRANCH, **options}
    )
    return compaction.compact_table(table, resolved)


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("file_kind", [FIELD_IDS, IMPORTED], indirect=True)
def test_a_branch_is_compacted_and_main_is_not_touched(
    catalog: Catalog, events: Table, file_kind: str
) -> None:
    main_head, branch_head = _head(events, "main"), _head(events, BRANCH)
    main_rows, branch_rows = _rows(events, "main"), _rows(events, BRANCH)
    branch_files = live_data_files(events, events.snapshot_by_name(BRANCH))
    # Imported, the branch compacts main's files without field ids along with its own.
    assert bool(files_without_field_ids(events, events.snapshot_by_name(BRANCH))) == (
        file_kind == IMPORTED
    )

    result = _compact(catalog)

    table = catalog.load_table(TABLE)
    data = result.to_dict()
    assert data["plan"]["branch"] == BRANCH and data["failed_groups"] == []
    assert _head(table, "main") == main_head
    snapshot = table.snapshot_by_name(BRANCH)
    assert snapshot is not None and snapshot.snapshot_id == data["snapshot_id"]
    assert snapshot.parent_snapshot_id == branch_head
    assert snapshot.summary is not None and snapshot.summary.operation == Operation.REPLACE
    assert len(live_data_files(table, snapshot)) < len(branch_files)
    assert_same_rows(branch_rows, _rows(table, BRANCH))
    assert_same_rows(main_rows, _rows(table, "main"))
    assert files_without_field_ids(table, snapshot) == [], "Java compares the branch's rows"
    assert_java_reads_same(table, unmapped_snapshots(table))


def test_commits_to_main_meanwhile_do_not_conflict_with_a_branch_run(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Main moves before the run commits, and again inside its catalog call (after the run
    last read the table): neither touches the branch, so both end in one branch commit."""
    branch_rows = _rows(events, BRANCH)
    moves: list[str] = []

    def move_main(why: str) -> None:
        moves.append(why)
        other = catalog.load_table(TABLE)
        other.append(events_batch(commit=30 + len(moves), rows=240, days=3))
        other.delete(f"event_id < {100 * len(moves)}")  # rewrites files the branch shares

    def commit_after_main_moved(table: Table, *args: object, **kwargs: object):
        move_main("before the commit")
        return commit_replace(table, *args, **kwargs)  # type: ignore[arg-type]

    commit_table = catalog.commit_table

    def commit_table_after_main_moved(table: Table, requirements: tuple, updates: tuple):
        to_branch = any(getattr(r, "ref", None) == BRANCH for r in requirements)
        if to_branch and "inside the catalog call" not in moves:
            move_main("inside the catalog call")
        return commit_table(table, requirements, updates)

    monkeypatch.setattr(compaction, "commit_replace", commit_after_main_moved)
    monkeypatch.setattr(catalog, "commit_table", commit_table_after_main_moved)
    result = _compact(catalog)

    assert moves == ["before the commit", "inside the catalog call"]
    # The second move took the sequence number the run had chosen: one retry, no refusal.
    assert [c.attempts for c in result.commits] == [2]
    assert result.to_dict()["failed_groups"] == []
    table = catalog.load_table(TABLE)
    assert table.snapshot_by_name(BRANCH).snapshot_id == result.to_dict()["snapshot_id"]  # type: ignore[union-attr]
    assert_same_rows(branch_rows, _rows(table, BRANCH))
    assert_java_reads_same(table)


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("file_kind", [FIELD_IDS, IMPORTED], indirect=True)
def test_an_append_to_the_branch_meanwhile_is_kept(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    appended = events_batch(commit=40, rows=240, days=3)
    before = _rows(events, BRANCH)

    def commit_after_branch_append(table: Table, *args: object, **kwargs: object):
        catalog.load_table(TABLE).append(appended, branch=BRANCH)
        return commit_replace(table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compaction, "commit_replace", commit_after_branch_append)
    result = _compact(catalog)

    assert result.to_dict()["failed_groups"] == []
    table = catalog.load_table(TABLE)
    assert_same_rows(pa.concat_tables([before, appended.cast(before.schema)]), _rows(table, BRANCH))
    assert files_without_field_ids(table, table.snapshot_by_name(BRANCH)) == []
    assert_java_reads_same(table, unmapped_snapshots(table))


def test_a_missing_branch_or_a_tag_is_a_one_line_error_and_nothing_changes(
    catalog: Catalog, events: Table
) -> None:
    events.manage_snapshots().create_tag(_head(events, "main"), "v1").commit()
    before = catalog.load_table(TABLE).metadata.refs
    with pytest.raises(
        UsageError, match=r"table db\.events: no branch 'nope' \(branches: audit, main\)"
    ):
        _compact(catalog, branch="nope")
    with pytest.raises(UsageError, match=r"table db\.events: 'v1' is a tag; compactor commits to"):
        _compact(catalog, branch="v1")
    assert catalog.load_table(TABLE).metadata.refs == before


def test_the_commit_line_names_the_branch_it_committed_to(tmp_path: Path) -> None:
    table = create_events_table(embedded(tmp_path), TABLE, commits=3, rows_per_commit=480)
    table.manage_snapshots().create_branch(_head(table, "main"), BRANCH).commit()
    run = ("run", "--table", TABLE, "--min-input-files", "2")

    on_branch = compactor_cli(tmp_path, *run, "--branch", BRANCH)
    on_main = compactor_cli(tmp_path, *run)

    assert on_branch.returncode == 0 and on_main.returncode == 0, on_branch.stderr + on_main.stderr
    branch_head = _head(embedded(tmp_path).load_table(TABLE), BRANCH)
    assert f"committed replace snapshot {branch_head} to branch {BRANCH}: " in on_branch.stdout
    assert "committed replace snapshot" in on_main.stdout and "to branch" not in on_main.stdout
