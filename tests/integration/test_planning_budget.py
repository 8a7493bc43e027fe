"""Planning within --memory-limit: candidates past the budget are left for the next run.

The budget is forced down to a few files by raising the bytes one candidate is counted at, so
that a table of a few tiny files is cut as a table of millions would be. Planning meets data
files newest first (a fast append lists its manifest first): the oldest are left.
"""

from __future__ import annotations

import logging
from collections import Counter

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from compactor.options import compact, resolve_options
from compactor.options.defaults import (
    DEFAULT_MEMORY_LIMIT,
    PLANNING_MEMORY_SHARE,
    PROCESS_ALLOWANCE,
)
from compactor.planning.planner import plan_rewrite

from support.deletes import (
    commit_delete_files,
    write_equality_delete_file,
    write_position_delete_file,
)
from support.rows import scan_rows
from support.runs import DEFAULT_OPTIONS, compact_and_verify, run_compaction
from support.tables import live_data_files, live_delete_files, live_entries, read_data_file

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
)
ROWS_PER_FILE = 5
FILES = 6
EVERY_ID = Counter(range(FILES * ROWS_PER_FILE))


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> int:
    """Planning keeps 4 candidates under the default memory limit."""
    kept = 4
    share = int((DEFAULT_MEMORY_LIMIT - PROCESS_ALLOWANCE) * PLANNING_MEMORY_SHARE)
    monkeypatch.setattr(compact, "PLANNED_FILE_BYTES", share // kept)
    assert compact.planning_budget(DEFAULT_MEMORY_LIMIT) == kept
    return kept


def _append(table: Table, numbers: range) -> Table:
    """Append files ``numbers`` (their ids follow from the number), one commit each."""
    for number in numbers:
        ids = range(number * ROWS_PER_FILE, (number + 1) * ROWS_PER_FILE)
        rows = [{"id": i, "name": f"row {i}"} for i in ids]
        table.append(pa.Table.from_pylist(rows, SCHEMA.as_arrow()))
    return table


def _planning_order(table: Table) -> list[DataFile]:
    """The live data files as planning meets them: manifest list order, then entry order."""
    entries = live_entries(table)
    return [e.data_file for e in entries if e.data_file.content == DataFileContent.DATA]


def _stored_ids(table: Table, data_file: DataFile) -> list[int]:
    """The ids stored in ``data_file``, in file order (no delete applied)."""
    return read_data_file(table, data_file).column("id").to_pylist()


def _all_stored_ids(table: Table) -> Counter[int]:
    return Counter(i for f in live_data_files(table).values() for i in _stored_ids(table, f))


def test_a_run_rewrites_only_the_files_within_its_budget_and_the_next_takes_the_rest(
    catalog: Catalog, budget: int, caplog: pytest.LogCaptureFixture
) -> None:
    table = _append(catalog.create_table("db.t", SCHEMA), range(FILES + 1))
    order = [f.file_path for f in _planning_order(table)]
    kept, deferred = order[:budget], order[budget:]
    # The same table and limit make the same plan.
    options = resolve_options("db.t", table.metadata.properties, **DEFAULT_OPTIONS).plan
    plans = [plan_rewrite(table, "db.t", options)[0] for _ in range(2)]
    assert [f.path for f in plans[0].groups[0].files] == [f.path for f in plans[1].groups[0].files]

    with caplog.at_level(logging.WARNING, logger="compactor.planning.planner"):
        result, after, _ = compact_and_verify(catalog, "db.t")

    summary = result.to_dict()
    assert summary["plan"]["deferred_files"] == len(deferred) == 3
    assert summary["plan"]["data_files_scanned"] == FILES + 1
    assert sorted(f.path for f in result.rewritten_files) == sorted(kept)
    live = set(live_data_files(after))
    assert set(deferred) <= live and not set(kept) & live
    assert "the next run takes the 3 others" in caplog.text

    # The next run takes the files left and the one written: fewer than the budget.
    result, after, _ = compact_and_verify(catalog, "db.t")
    assert result.to_dict()["plan"]["deferred_files"] == 0
    assert set(deferred) <= {f.path for f in result.rewritten_files}
    assert len(live_data_files(after)) == 1


def test_position_deletes_of_deferred_files_stay_until_those_are_rewritten(
    catalog: Catalog, budget: int
) -> None:
    table = _append(catalog.create_table("db.t", SCHEMA), range(FILES))
    order = _planning_order(table)
    kept, deferred = order[0], order[-1]
    gone = {_stored_ids(table, kept)[1], _stored_ids(table, deferred)[2]}
    gone.add(_stored_ids(table, deferred)[3])
    deletes = [
        write_position_delete_file(table, {kept: [1], deferred: [2]}),  # both
        write_position_delete_file(table, {deferred: [3]}),  # met only past the budget
    ]
    commit_delete_files(table, deletes)

    result, after, before = compact_and_verify(catalog, "db.t")

    assert result.to_dict()["plan"]["deferred_files"] == 2
    rewritten = {f.path for f in result.rewritten_files}
    assert kept.file_path in rewritten and deferred.file_path not in rewritten
    assert set(live_delete_files(after)) == {d.file_path for d in deletes}
    assert before.num_rows == FILES * ROWS_PER_FILE - len(gone)
    assert not gone & set(scan_rows(after).column("id").to_pylist())

    # The next run rewrites the deferred files: the delete files apply to nothing left.
    result, after, _ = compact_and_verify(catalog, "db.t")
    assert result.to_dict()["plan"]["deferred_files"] == 0
    assert deferred.file_path in {f.path for f in result.rewritten_files}
    assert live_delete_files(after) == {}


def test_a_global_equality_delete_of_deferred_files_stays_until_those_are_rewritten(
    catalog: Catalog, budget: int
) -> None:
    table = _append(catalog.create_table("db.t", SCHEMA), range(1))
    (oldest,) = live_data_files(table).values()
    gone = Counter(_stored_ids(table, oldest)[2:4])
    # An unpartitioned spec's equality delete applies to every file written before it.
    delete_file = write_equality_delete_file(
        table, ["id"], [(i,) for i in gone], spec_id=0, partition=Record()
    )
    table = _append(commit_delete_files(table, [delete_file]), range(1, FILES))
    assert _planning_order(table)[-1].file_path == oldest.file_path

    result, after = run_compaction(catalog, "db.t")

    assert result.to_dict()["plan"]["deferred_files"] == 2
    assert len(result.rewritten_files) == budget
    assert set(live_delete_files(after)) == {delete_file.file_path}
    assert oldest.file_path in live_data_files(after)
    assert _all_stored_ids(after) == EVERY_ID  # the deleted rows hidden by the delete file

    result, after = run_compaction(catalog, "db.t")
    assert result.to_dict()["plan"]["deferred_files"] == 0
    assert live_delete_files(after) == {}
    assert _all_stored_ids(after) == EVERY_ID - gone


def test_partitions_that_cannot_make_a_group_do_not_hold_the_budget(
    catalog: Catalog, budget: int
) -> None:
    """Planning meets four lone files (newest) before a partition of three: kept, the lone
    files would fill the budget with nothing worth rewriting, run after run."""
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="name")
    )
    table = catalog.create_table("db.t", SCHEMA, partition_spec=spec)
    for name in ["big"] * 3 + [f"lone{i}" for i in range(budget)]:
        rows = [{"id": i, "name": name} for i in range(ROWS_PER_FILE)]
        table.append(pa.Table.from_pylist(rows, SCHEMA.as_arrow()))
    big = {f.file_path for f in _planning_order(table) if f.partition[0] == "big"}

    result, _, _ = compact_and_verify(catalog, "db.t")

    assert {f.path for f in result.rewritten_files} == big
    assert result.to_dict()["plan"]["deferred_files"] == budget


def test_the_run_gives_its_workers_the_memory_its_plan_leaves(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tasks of a run get their shares beside the files the plan keeps, not the whole
    limit: fewer bytes than a plan of no file would leave them."""
    import compactor.compaction as compaction

    from support.tables import events_table

    table = events_table(catalog, "db.shares", commits=5, rows_per_commit=50, days=1)
    planned = len(live_data_files(table))
    given: list[compact.ExecutionOptions] = []
    plan_tasks = compaction.plan_tasks

    def recorded(plan, run_id, io_properties, execution):  # type: ignore[no-untyped-def]
        given.append(execution)
        return plan_tasks(plan, run_id, io_properties, execution)

    monkeypatch.setattr(compaction, "plan_tasks", recorded)
    options = {**DEFAULT_OPTIONS, "memory_limit": "448MiB", "parallelism": 1}
    alone = resolve_options("db.shares", table.metadata.properties, **options).execution

    result, _ = run_compaction(catalog, "db.shares", **options)

    assert sum(len(g.files) for g in result.plan.groups) == planned
    assert [e.read_ahead for e in given] == [alone.beside_plan(planned).read_ahead]
    assert given[0].read_ahead < alone.read_ahead
    assert given[0].row_group_size == given[0].read_ahead
