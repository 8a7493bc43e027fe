"""Bulk reading: files that need none of Iceberg's read rules are read many at once.

A bulk scan reads each file's columns by field id: renamed, widened by a type promotion, filled
with nulls where the file lacks them; what needs more of Iceberg's read rules goes through the
Iceberg read path. Each test here builds the case where reading by name would return wrong
rows, and checks that the rows after compaction are exactly the rows before, read by pyiceberg
and by Iceberg Java.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.typedef import Record
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from compactor.bench.sample import create_events_table
from compactor.errors import DataFileError, UnreadableFileError
from compactor.rewrite import bulk_read
from compactor.rewrite.bulk_read import BulkRead

from support.deletes import (
    commit_delete_files,
    write_equality_delete_file,
    write_position_delete_file,
)
from support.java_reader import JavaReader, assert_java_reads_same
from support.rows import assert_same_rows, scan_rows
from support.runs import compact_and_verify, run_compaction
from support.tables import live_data_files, read_data_file

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "v", IntegerType(), required=False),
    NestedField(3, "s", StringType(), required=False),
)


def _rows(table: Table, start: int, count: int = 40) -> pa.Table:
    """``count`` rows in ``table``'s current schema: id, s, and v under its current name/type."""
    schema = table.schema().as_arrow()
    values = {
        "id": list(range(start, start + count)),
        "s": [f"s{start + i}" for i in range(count)],
    }
    columns = [pa.array(values.get(f.name, [i % 7 for i in range(count)]), f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _table(catalog: Catalog, appends: int = 3) -> Table:
    table = catalog.create_table("db.t", SCHEMA)
    for n in range(appends):
        table.append(_rows(table, n * 100))
    return table


def test_files_of_the_current_schema_without_deletes_are_read_in_bulk(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    create_events_table(catalog, "db.events", commits=4, rows_per_commit=480)

    result, after, _ = compact_and_verify(catalog, "db.events")

    summary = result.to_dict()
    assert summary["bulk_read_files"] == summary["rewritten_files"] > 0


def test_without_bulk_read_every_file_takes_the_iceberg_read_path(catalog: Catalog) -> None:
    create_events_table(catalog, "db.events", commits=4, rows_per_commit=480)

    result, _, _ = compact_and_verify(catalog, "db.events", bulk_read=False)

    assert result.to_dict()["bulk_read_files"] == 0


def test_files_with_position_deletes_are_read_in_bulk_without_the_deleted_rows(
    catalog: Catalog,
) -> None:
    table = _table(catalog)
    victim, other = sorted(live_data_files(table).values(), key=lambda f: f.file_path)[:2]
    ids = read_data_file(table, victim).column("id").to_pylist()
    other_ids = read_data_file(table, other).column("id").to_pylist()
    commit_delete_files(table, [write_position_delete_file(table, {victim: [0, 5, 9, 39]})])
    # Two delete files for one data file, overlapping, one of them all but one of its rows.
    commit_delete_files(table, [write_position_delete_file(table, {victim: [5, 6]})])
    commit_delete_files(table, [write_position_delete_file(table, {other: range(1, 40)})])

    result, after, before = compact_and_verify(catalog, "db.t")

    summary = result.to_dict()
    assert summary["bulk_read_files"] == 3 and summary["deleted_rows_applied"] == 5 + 39
    left = set(scan_rows(after).column("id").to_pylist())
    assert not {ids[0], ids[5], ids[6], ids[9], ids[39]} & left
    assert {ids[1], ids[38], other_ids[0]} <= left and not set(other_ids[1:]) & left


def test_files_with_equality_deletes_take_the_iceberg_read_path(catalog: Catalog) -> None:
    table = _table(catalog)
    stored = pa.concat_tables(read_data_file(table, f) for f in live_data_files(table).values())
    spec_id = table.spec().spec_id
    delete = write_equality_delete_file(
        table, ["id"], [(5,), (105,)], spec_id=spec_id, partition=Record()
    )
    commit_delete_files(table, [delete])

    result, after = run_compaction(catalog, "db.t")

    summary = result.to_dict()
    assert summary["bulk_read_files"] == 0 and summary["deleted_rows_applied"] == 2
    expected = stored.filter(pa.compute.invert(pa.compute.is_in(stored["id"], pa.array([5, 105]))))
    assert_same_rows(expected, scan_rows(after).select(expected.column_names))


@pytest.mark.parametrize(
    "evolve",
    [
        # The old files hold a column named "v" under field id 2; the new "v" is id 4.
        pytest.param(
            lambda u: (u.delete_column("v"), u.add_column("v", IntegerType())), id="re-added"
        ),
        # The old files hold id 2 as "v"; the table calls it "w" now.
        pytest.param(lambda u: u.rename_column("v", "w"), id="renamed"),
        # The old files hold id 2 as int32; the table says long.
        pytest.param(lambda u: u.update_column("v", LongType()), id="promoted"),
    ],
)
def test_files_whose_columns_differ_from_the_schema_are_read_by_field_id(
    catalog: Catalog, java_reader: JavaReader, evolve
) -> None:
    table = _table(catalog, appends=2)
    with table.update_schema() as update:
        evolve(update)
    table = catalog.load_table("db.t")
    table.append(_rows(table, 900))
    table.append(_rows(table, 1000))
    before = scan_rows(table)

    result, after, _ = compact_and_verify(catalog, "db.t")

    assert result.to_dict()["bulk_read_files"] == 4  # projected by field id in the scan
    assert_same_rows(before, scan_rows(after))
    assert_java_reads_same(after)


def test_rows_keep_the_order_of_the_inputs_across_both_read_paths(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files read in bulk and files read each interleave in write order (clustering survives)."""
    table = _table(catalog, appends=2)  # ids 0.. and 100..: "v" is renamed, read by field id
    with table.update_schema() as update:
        update.rename_column("v", "w")
    table = catalog.load_table("db.t")
    for start in (200, 300, 400):
        table.append(_rows(table, start))
    with_delete = next(
        f
        for f in live_data_files(table).values()
        if read_data_file(table, f)["id"][0].as_py() == 300
    )
    commit_delete_files(table, [write_position_delete_file(table, {with_delete: [1]})])
    plain = bulk_read._plain  # ids 300.. are left to the Iceberg read path
    monkeypatch.setattr(bulk_read, "_plain", lambda f: f.path != with_delete.file_path and plain(f))

    result, after, _ = compact_and_verify(catalog, "db.t")

    assert result.to_dict()["bulk_read_files"] == 4  # all but ids 300..
    (written,) = live_data_files(after).values()
    ids = read_data_file(after, written).column("id").to_pylist()
    assert len(ids) == 5 * 40 - 1
    assert ids == sorted(ids)


def test_consecutive_files_on_one_file_system_are_scanned_together(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One scan for a run of files, not one per file: a scan's set-up costs about a file's read."""
    scans: list[int] = []
    scan = BulkRead._scan

    def counting(self: BulkRead, fragments: list, streamed: bool) -> Iterator[pa.RecordBatch]:
        scans.append(len(fragments))
        return scan(self, fragments, streamed)

    monkeypatch.setattr(BulkRead, "_scan", counting)
    _table(catalog, appends=5)

    result, _, _ = compact_and_verify(catalog, "db.t")

    assert result.to_dict()["bulk_read_files"] == 5
    assert scans == [5]


def test_a_bulk_scan_failing_for_no_one_file_fails_its_group_naming_the_files(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan of many files does not say which one failed: each is read again alone. When
    none fails alone (the storage hiccuped), the group fails naming the run's files; no file is
    taken for unreadable, nothing is committed."""
    scan = BulkRead._scan

    def failing(self: BulkRead, fragments: list, streamed: bool) -> Iterator[pa.RecordBatch]:
        yield from scan(self, fragments[:1], streamed)
        raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 56")

    monkeypatch.setattr(BulkRead, "_scan", failing)
    table = _table(catalog, appends=5)
    head, paths = table.current_snapshot(), sorted(live_data_files(table))

    with pytest.raises(DataFileError, match="read together") as raised:
        run_compaction(catalog, "db.t")

    assert not isinstance(raised.value, UnreadableFileError)
    message = str(raised.value)
    assert sum(path in message for path in paths) == 3 and ", ..." in message  # 3 of the 5
    assert "NETWORK_CONNECTION" in message
    assert catalog.load_table("db.t").current_snapshot() == head
