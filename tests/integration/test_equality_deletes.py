"""Equality deletes applied in the rewrite, judged by Iceberg's Java reader.

Iceberg Java applies equality deletes itself when it reads a snapshot, so the rows it reads of
the snapshot before compaction (deletes applied by Java) must equal the rows it reads after
(deletes applied by compactor, delete files gone). The table mixes what makes equality hard:
null keys (null equals null), NaN and -0.0 (compared as Java does), multi-column keys, deletes
in one partition only, a column renamed and a type promoted between the data and the deletes,
and rows re-inserted with a deleted key after the delete.
"""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DateType, DoubleType, IntegerType, LongType, NestedField, StringType

from support.deletes import commit_delete_files, write_equality_delete_file
from support.java_reader import assert_java_reads_same, java_read
from support.runs import run_compaction
from support.tables import live_data_files, live_delete_files

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")

DAYS = (dt.date(2026, 1, 1), dt.date(2026, 1, 2))
EPOCH = dt.date(1970, 1, 1)
NAMES = ("a", "b", None)
SCORES = (1.5, math.nan, -0.0, 0.0, None)
SCHEMA = Schema(
    NestedField(1, "id", IntegerType(), required=False),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "score", DoubleType(), required=False),
    NestedField(4, "day", DateType(), required=False),
)
SPEC = PartitionSpec(PartitionField(4, 1000, IdentityTransform(), "day"))


def _batch(table: Table, first: int, rows: int, name_column: str = "name") -> pa.Table:
    ids = range(first, first + rows)
    return pa.Table.from_pylist(
        [
            {
                "id": i,
                name_column: NAMES[i % 3],
                "score": SCORES[i % 5],
                "day": DAYS[i % 2],
            }
            for i in ids
        ],
        table.schema().as_arrow(),
    )


def _delete(table: Table, columns: list[str], rows: list[tuple], day: dt.date) -> Table:
    delete_file = write_equality_delete_file(
        table, columns, rows, spec_id=table.spec().spec_id, partition=Record((day - EPOCH).days)
    )
    return commit_delete_files(table, [delete_file])


def test_equality_deletes_read_by_java_equal_the_rewritten_rows(
    catalog: Catalog, java_reader: object
) -> None:
    table = catalog.create_table(
        "db.cdc", SCHEMA, partition_spec=SPEC, properties={"format-version": "2"}
    )
    for commit in range(6):
        table.append(_batch(table, commit * 30, 30))
    table = catalog.load_table("db.cdc")
    # Day 1: null names and "b" go (null equals null). Day 2: NaN and -0.0 scores go, 0.0 stays.
    table = _delete(table, ["name"], [(None,), ("b",)], DAYS[0])
    table = _delete(table, ["score"], [(math.nan,), (-0.0,)], DAYS[1])
    # Between the data and the next deletes: a rename and a promotion (int -> long).
    with table.update_schema() as update:
        update.update_column("id", LongType())
        update.rename_column("name", "label")
    table = catalog.load_table("db.cdc")
    for commit in range(6, 8):  # newer rows: "b" again on day 1, NaN again on day 2 — they stay
        table.append(_batch(table, commit * 30, 30, name_column="label"))
    table = catalog.load_table("db.cdc")
    # A two-column key on the renamed, promoted columns; (id 0, "a") and (id 3, null) on day 1.
    table = _delete(table, ["id", "label"], [(0, "a"), (3, None), (6, "a")], DAYS[0])
    parent = table.current_snapshot().snapshot_id
    stored = sum(f.record_count for f in live_data_files(table).values())
    deletes_before = live_delete_files(table)
    assert len(deletes_before) == 3

    result, after = run_compaction(catalog, "db.cdc")

    assert not result.plan.skipped
    assert result.to_dict()["removed_delete_files"]["equality"] == 3
    assert live_delete_files(after) == {}
    assert len(live_data_files(after)) == 2  # one per day
    current = after.current_snapshot().snapshot_id
    java = java_read(after, [parent, current])
    before_rows = java.snapshots[parent].read
    after_rows = java.snapshots[current].read
    assert before_rows is not None and after_rows is not None
    assert after_rows.rows == before_rows.rows
    # The deletes did take rows out, and the rows now stored are exactly those Java read before.
    assert 0 < before_rows.row_count < stored
    assert result.to_dict()["deleted_rows_applied"] == stored - before_rows.row_count
    assert_java_reads_same(after, snapshot_ids=[current])


def test_a_delete_on_a_column_since_dropped_leaves_its_files_alone(catalog: Catalog) -> None:
    """The current schema cannot match rows against it, so compactor leaves its files alone.

    (Iceberg Java 1.11 cannot read such a table at all: "Cannot find required field for ID 2".)
    """
    table = catalog.create_table(
        "db.dropped", SCHEMA, partition_spec=SPEC, properties={"format-version": "2"}
    )
    for commit in range(6):
        table.append(_batch(table, commit * 30, 30))
    table = _delete(catalog.load_table("db.dropped"), ["name"], [("b",)], DAYS[0])
    with table.update_schema() as update:
        update.delete_column("name")
    table = catalog.load_table("db.dropped")
    day1 = {p for p in live_data_files(table) if "day=2026-01-01" in p}
    day2 = {p for p in live_data_files(table) if "day=2026-01-02" in p}

    result, after = run_compaction(catalog, "db.dropped")

    assert result.plan.skipped["equality_deletes_on_columns_no_longer_in_the_schema"] == 6
    assert day1 <= set(live_data_files(after))
    assert not day2 & set(live_data_files(after))  # the other day, out of the delete's reach
    assert len(live_delete_files(after)) == 1
