"""Bulk reading of nested columns and of format 3 tables.

Most tests build one table twice, the same way, and compact one copy with bulk reading and the
other through the Iceberg read path file by file: the files written must hold the same rows in
the same order (row lineage included), and the bulk copy must have read its inputs in bulk.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadataV3
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from compactor.iceberg import pyiceberg_compat
from compactor.iceberg.delete_files import write_deletion_vectors
from compactor.iceberg.pyiceberg_compat import (
    LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID,
    ROW_ID_FIELD_ID,
    first_row_id,
    manifest_entries,
    read_position_deletes,
    snapshot_manifests,
)

from support.deletes import commit_delete_files, write_position_delete_file
from support.java_reader import JavaReader, assert_java_reads_same, java_read
from support.rows import assert_same_rows, scan_rows
from support.runs import EVERY_READ_PATH, run_compaction
from support.tables import IMPORTED, append_rows, live_data_files, local_path

NAME_MAPPING = "schema.name-mapping.default"
Build = Callable[[Catalog, str], Table]

NESTED = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(
        2,
        "point",
        StructType(
            NestedField(3, "x", IntegerType(), required=False),
            NestedField(4, "label", StringType(), required=False),
        ),
        required=False,
    ),
    NestedField(5, "tags", ListType(6, IntegerType(), element_required=False), required=False),
    NestedField(
        7, "attrs", MapType(8, StringType(), 9, LongType(), value_required=False), required=False
    ),
    # Nested in nested: a list of structs, each with a map of structs.
    NestedField(
        10,
        "events",
        ListType(
            11,
            StructType(
                NestedField(12, "at", IntegerType(), required=False),
                NestedField(
                    13,
                    "parts",
                    MapType(
                        14,
                        StringType(),
                        15,
                        StructType(NestedField(16, "n", IntegerType(), required=False)),
                        value_required=False,
                    ),
                    required=False,
                ),
            ),
            element_required=False,
        ),
        required=False,
    ),
)


def _value(kind: pa.DataType, i: int, nullable: bool = True) -> Any:
    """A value of ``kind`` for row ``i``: nulls, empty lists and maps among them."""
    if nullable and i % 11 == 3:
        return None
    if pa.types.is_struct(kind):
        return {f.name: _value(f.type, i + n, f.nullable) for n, f in enumerate(kind.fields)}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        element = kind.value_field
        return [_value(element.type, i + n, element.nullable) for n in range(i % 3)]
    if pa.types.is_map(kind):
        item = kind.item_field
        return [(f"k{n}", _value(item.type, i + n, item.nullable)) for n in range(i % 4)]
    if pa.types.is_integer(kind):
        return i % 1000
    if pa.types.is_floating(kind):
        return i / 4
    return f"v{i}"


def _rows(schema: pa.Schema, start: int, count: int = 40) -> pa.Table:
    """``count`` rows of ``schema`` (an Arrow schema), ids from ``start``."""
    columns = [
        pa.array(
            list(range(start, start + count))
            if f.name == "id"
            else [_value(f.type, i, f.nullable) for i in range(start, start + count)],
            f.type,
        )
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _append(table: Table, start: int, count: int = 40) -> None:
    """``count`` rows from ``start`` in one snapshot, as the test's ``file_kind`` (if any)
    writes them: with field ids, or imported without."""
    append_rows(table, _rows(table.schema().as_arrow(), start, count))


def _written(table: Table) -> pa.Table:
    """The rows of the table's one data file, as stored (row lineage columns included)."""
    (path,) = live_data_files(table)
    return pq.read_table(local_path(path))


def _compact_both(catalog: Catalog, build: Build) -> tuple[dict[str, Any], Table, pa.Table]:
    """Build two copies; compact one with bulk reading, one without; the same rows written.

    Returns the bulk run's summary, its table and the rows pyiceberg read before it.
    """
    bulk, each = build(catalog, "db.bulk"), build(catalog, "db.each")
    files = len(live_data_files(bulk))
    before = scan_rows(bulk) if bulk.format_version < 3 else None
    result, bulk = run_compaction(catalog, "db.bulk")
    _, each = run_compaction(catalog, "db.each", bulk_read=False)

    summary = result.to_dict()
    assert summary["rewritten_files"] == files
    written, expected = _written(bulk), _written(each)
    assert written.schema.equals(expected.schema)
    assert written.to_pylist() == expected.to_pylist()  # the same rows, in the same order
    return summary, bulk, before


# --------------------------------------------------------------------------------------------
# Nested columns
# --------------------------------------------------------------------------------------------


def _evolved(catalog: Catalog, identifier: str) -> Table:
    """Files of NESTED, then nested fields renamed, added, dropped and widened, then files of
    the new schema."""
    table = catalog.create_table(identifier, NESTED)
    _append(table, 0)
    _append(table, 100)
    with table.update_schema() as update:
        update.rename_column("point.label", "name")
        update.rename_column("events.element.parts.value.n", "count")
        update.add_column(("point", "z"), DoubleType())
        update.add_column(("events", "element", "note"), StringType())
        update.delete_column("point.x")
        update.update_column("tags.element", LongType())
        update.update_column("events.element.at", LongType())
    table = catalog.load_table(identifier)
    _append(table, 200)
    _append(table, 300)
    return catalog.load_table(identifier)


@pytest.mark.parametrize("read_path", ["bulk", "streamed"], indirect=True)
@pytest.mark.usefixtures("read_path")
def test_nested_columns_are_read_in_bulk_by_field_id(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    summary, after, before = _compact_both(catalog, _evolved)

    assert summary["bulk_read_files"] == 4
    assert_same_rows(before, scan_rows(after))
    point = scan_rows(after).sort_by("id")["point"].to_pylist()
    assert point[1] == {"name": "v2", "z": None}  # renamed, and added after the file
    assert_java_reads_same(after)


def _plain_nested_file(path: Path, start: int) -> str:
    """A Parquet file of NESTED's columns as plain pyarrow writes them: no field ids."""
    pq.write_table(_rows(schema_to_pyarrow(NESTED, include_field_ids=False), start), path)
    return path.as_uri()


def _imported(catalog: Catalog, identifier: str, tmp_path: Path) -> Table:
    """Files without field ids, a nested field renamed since, and files with ids."""
    table = catalog.create_table(identifier, NESTED)
    directory = tmp_path / identifier
    directory.mkdir()
    table.add_files([_plain_nested_file(directory / f"{s}.parquet", s) for s in (0, 100, 200)])
    with table.update_schema() as update:
        update.rename_column("point.label", "name")
        update.rename_column("events.element.parts.value.n", "count")
    table = catalog.load_table(identifier)
    _append(table, 300)
    return catalog.load_table(identifier)


@pytest.mark.parametrize("read_path", ["bulk", "streamed"], indirect=True)
@pytest.mark.usefixtures("read_path")
def test_nested_columns_of_files_without_field_ids_are_read_in_bulk_through_the_mapping(
    catalog: Catalog, tmp_path: Path
) -> None:
    summary, after, _ = _compact_both(catalog, lambda c, i: _imported(c, i, tmp_path))

    assert summary["bulk_read_files"] == 4
    point = scan_rows(after).sort_by("id")["point"].to_pylist()
    assert point[0] == {"x": 0, "name": "v1"}  # the old name, read through the mapping
    events = _written(after).sort_by("id")["events"].to_pylist()[:120]
    schema = after.schema().as_arrow()  # "count" now, "n" in the files
    assert events == [e for s in (0, 100, 200) for e in _rows(schema, s)["events"].to_pylist()]
    assert events[3] is None and events[2][0]["parts"] is None


@pytest.mark.parametrize("read_path", EVERY_READ_PATH, indirect=True)
def test_null_lists_and_maps_of_structs_stay_null(
    catalog: Catalog, tmp_path: Path, read_path: str
) -> None:
    """Files written by pyarrow with field ids, nulls at every level of nesting: the rows
    written are the rows of the files, on both read paths (pyiceberg's own read path, file by
    file, reads a null list or map of structs as empty: compactor puts the null back)."""
    table = catalog.create_table("db.t", NESTED)
    schema = table.schema().as_arrow()  # the table's field ids
    stored = [_rows(schema, start) for start in (0, 100, 200)]
    for data in stored:
        _add_file(table, tmp_path / f"{data['id'][0]}.parquet", data)

    result, after = run_compaction(catalog, "db.t")

    assert result.to_dict()["bulk_read_files"] == (0 if read_path == "iceberg" else 3)
    assert _written(after).to_pylist() == pa.concat_tables(stored).to_pylist()
    events = _written(after)["events"].to_pylist()
    assert events[3] is None and events[2][0]["parts"] is None


def test_a_nested_name_the_mapping_gives_two_fields_takes_the_iceberg_read_path(
    catalog: Catalog, tmp_path: Path
) -> None:
    def ambiguous(catalog: Catalog, identifier: str) -> Table:
        table = _imported(catalog, identifier, tmp_path)
        mapping = json.loads(table.metadata.properties[NAME_MAPPING])
        point = next(f for f in mapping if f["field-id"] == 2)
        point["fields"][1]["names"].append("x")  # "x" also names "point.name"
        with table.transaction() as tx:
            tx.set_properties({NAME_MAPPING: json.dumps(mapping)})
        return catalog.load_table(identifier)

    summary, _, _ = _compact_both(catalog, ambiguous)

    assert summary["bulk_read_files"] == 1  # the file with field ids


# --------------------------------------------------------------------------------------------
# Format 3: row lineage
# --------------------------------------------------------------------------------------------

V3_SCHEMA = Schema(*NESTED.fields[:3])


def _add_file(table: Table, path: Path, data: pa.Table, **write: Any) -> DataFile:
    """``data`` written by pyarrow at ``path``, appended to ``table``."""
    pq.write_table(data, path, **write)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path.as_uri(),
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=data.num_rows,
        file_size_in_bytes=path.stat().st_size,
        sort_order_id=None,
        key_metadata=None,
    )
    data_file.spec_id = table.spec().spec_id
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)
    return data_file


def _with_own_lineage(table: Table, path: Path, start: int, rows: int = 2500) -> DataFile:
    """A data file with ``_row_id`` and ``_last_updated_sequence_number`` columns, partly null,
    in row groups of 1000 rows (read in several batches), appended to ``table``."""
    data = _rows(table.schema().as_arrow(), start, rows)
    for name, field_id, values in (
        ("_row_id", ROW_ID_FIELD_ID, [90_000 + i if i % 3 == 0 else None for i in range(rows)]),
        (
            "_last_updated_sequence_number",
            LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID,
            [1 if i % 2 == 0 else None for i in range(rows)],
        ),
    ):
        field = pa.field(name, pa.int64(), metadata={b"PARQUET:field_id": str(field_id).encode()})
        data = data.append_column(field, pa.array(values, pa.int64()))
    return _add_file(table, path, data, row_group_size=1000)


def _upgraded(catalog: Catalog, identifier: str) -> Table:
    """The table upgraded to format 3, as Iceberg Java upgrades it (``next-row-id`` 0)."""
    pyiceberg_compat.install()
    table = catalog.load_table(identifier)
    doc = json.loads(table.metadata.model_dump_json())
    metadata = TableMetadataV3.model_validate({**doc, "format-version": 3, "next-row-id": 0})
    location = f"{table.metadata.location}/metadata/upgraded-to-v3.metadata.json"
    with table.io.new_output(location).create() as out:
        out.write(metadata.model_dump_json().encode())
    catalog.drop_table(identifier)
    return catalog.register_table(identifier, location)


def _v3_table(catalog: Catalog, identifier: str, tmp_path: Path, *, row_ids: bool) -> Table:
    """A format 2 table with a position delete file, a file of its own lineage columns, then
    upgraded to format 3; with ``row_ids``, then a deletion vector committed (which gives every
    data file its ``first_row_id``)."""
    table = catalog.create_table(identifier, V3_SCHEMA)
    for start in (0, 100, 200):
        _append(table, start)
    own = _with_own_lineage(table, tmp_path / f"{identifier}-own.parquet", 10_000)
    table = catalog.load_table(identifier)
    files = sorted(live_data_files(table).values(), key=lambda f: f.file_path != own.file_path)
    commit_delete_files(table, [write_position_delete_file(table, {files[1]: [0, 5]})])
    table = _upgraded(catalog, identifier)
    if row_ids:
        # The own-lineage file, deleted at positions in its first and third batches.
        table = commit_delete_files(table, write_deletion_vectors(table, {own: [1, 2, 2400]}))
    return table


def _lineage(table: Table) -> Counter[tuple[int, int | None, int | None]]:
    """Each live row's (id, _row_id, _last_updated_sequence_number), as the spec derives them
    from the data files and manifests."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    entries = [
        e
        for m in snapshot_manifests(table.io, snapshot, 3)
        for e in manifest_entries(table.io, m, 3)
    ]
    deleted: dict[str, set[int]] = {}
    for e in entries:
        if e.data_file.content == DataFileContent.POSITION_DELETES:
            for path, positions in read_position_deletes(table.io, e.data_file).items():
                deleted.setdefault(path, set()).update(positions.to_pylist())
    rows: Counter[tuple[int, int | None, int | None]] = Counter()
    for e in entries:
        f = e.data_file
        if f.content != DataFileContent.DATA:
            continue
        data = pq.read_table(local_path(f.file_path))
        nulls = [None] * data.num_rows
        own_ids = data["_row_id"].to_pylist() if "_row_id" in data.column_names else nulls
        name = "_last_updated_sequence_number"
        own_seqs = data[name].to_pylist() if name in data.column_names else nulls
        first = first_row_id(f)
        for pos, row in enumerate(data["id"].to_pylist()):
            if pos in deleted.get(f.file_path, ()):
                continue
            if first is None:
                rows[(row, None, None)] += 1
                continue
            row_id = first + pos if own_ids[pos] is None else own_ids[pos]
            seq = e.file_sequence_number if own_seqs[pos] is None else own_seqs[pos]
            rows[(row, row_id, seq)] += 1
    return rows


@pytest.mark.parametrize("read_path", ["bulk", "streamed"], indirect=True)
@pytest.mark.usefixtures("read_path")
def test_format_3_rows_keep_their_lineage_read_in_bulk(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader, file_kind: str
) -> None:
    """A table upgraded to format 3 (a migrated one too: its imported files beside a file
    with field ids) keeps every row's lineage through a bulk compaction, as Java reads it."""
    lineage: dict[str, Counter[tuple[int, int | None, int | None]]] = {}
    java: dict[str, Counter[Any]] = {}

    def build(catalog: Catalog, identifier: str) -> Table:
        table = _v3_table(catalog, identifier, tmp_path, row_ids=True)
        lineage[identifier] = _lineage(table)
        if file_kind != IMPORTED:  # Java reads files without field ids by position
            java[identifier] = java_read(table, []).lineage()
        return table

    summary, after, _ = _compact_both(catalog, build)

    assert summary["bulk_read_files"] == 4
    assert summary["deleted_rows_applied"] == 5
    before = lineage["db.bulk"]
    assert None not in {row_id for _, row_id, _ in before}
    assert 90_000 in {row_id for _, row_id, _ in before}  # the file's own, kept
    assert _lineage(after) == before
    read_by_java = java_read(after, []).lineage()
    if file_kind == IMPORTED:  # no Java read before: its ids and sequence numbers, as derived
        assert sorted((i, n) for _, i, n in read_by_java.elements()) == sorted(
            (i, n) for _, i, n in before.elements()
        )
    else:
        assert read_by_java == java["db.bulk"]


@pytest.mark.parametrize("read_path", ["bulk", "streamed"], indirect=True)
@pytest.mark.usefixtures("read_path", "file_kind")
def test_format_3_files_without_first_row_id_are_read_in_bulk_without_lineage(
    catalog: Catalog, tmp_path: Path
) -> None:
    """Just upgraded: no file has a ``first_row_id``, so no row has lineage yet, whatever its
    file holds; the replace snapshot gives every row its row id."""
    summary, after, _ = _compact_both(
        catalog, lambda c, i: _v3_table(c, i, tmp_path, row_ids=False)
    )

    assert summary["bulk_read_files"] == 4
    written = _written(after)
    assert written["_row_id"].null_count == written["_last_updated_sequence_number"].null_count
    assert written["_row_id"].null_count == written.num_rows == 3 * 40 - 2 + 2500
    row_ids = [row_id for _, row_id, _ in _lineage(after).elements()]
    assert sorted(row_ids) == list(range(len(row_ids)))
