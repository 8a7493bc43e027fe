"""Files without field ids (``add_files``, Spark's migrate) read in bulk through the name mapping.

Each test imports plain Parquet files, evolves the table so that reading them by column name
would return wrong rows, and checks that compaction keeps exactly the rows pyiceberg's per-file
read path returns before it, and that Iceberg Java, reading through the name mapping as its
engine readers do, reads those same rows before and after. The tests run with bulk reading on
and off.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from integration.test_compaction_types import SCHEMA as TYPES_SCHEMA
from integration.test_compaction_types import _value as types_value
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
)

from compactor.compaction import RunResult
from compactor.rewrite import file_projection

from support.deletes import commit_delete_files, write_position_delete_file
from support.java_reader import (
    JVM_OPTIONS,
    assert_java_reads_same,
    canonical_rows,
    ensure_reader,
)
from support.rows import assert_same_rows, scan_rows
from support.runs import EVERY_READ_PATH, run_compaction
from support.tables import live_data_files

pytestmark = [
    pytest.mark.usefixtures("read_path"),
    pytest.mark.parametrize("read_path", EVERY_READ_PATH, indirect=True),
]

NAME_MAPPING = "schema.name-mapping.default"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "qty", IntegerType(), required=False),
    NestedField(3, "ratio", FloatType(), required=False),
    NestedField(4, "price", DecimalType(7, 2), required=False),
    NestedField(5, "label", StringType(), required=False),
    NestedField(6, "note", StringType(), required=False),
)


def _plain_file(path: Path, start: int, rows: int = 60) -> str:
    """A Parquet file of SCHEMA's columns as plain pyarrow writes them: no field ids."""
    ids = range(start, start + rows)
    data = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "qty": pa.array([None if i % 7 == 0 else i % 1000 for i in ids], pa.int32()),
            "ratio": pa.array([i / 3 for i in ids], pa.float32()),
            "price": pa.array([f"{i % 997}.{i % 100:02d}" for i in ids]).cast(pa.decimal128(7, 2)),
            "label": pa.array(
                [None if i % 11 == 0 else f"label-{i}" for i in ids], pa.large_string()
            ),
            "note": pa.array([f"note-{i}" for i in ids], pa.large_string()),
        }
    )
    pq.write_table(data, path)
    return path.as_uri()


def _import(table: Table, directory: Path, starts: range) -> list[str]:
    directory.mkdir(exist_ok=True)
    paths = [_plain_file(directory / f"part-{start}.parquet", start) for start in starts]
    table.add_files(paths)
    return paths


def _append(table: Table, start: int, rows: int = 60) -> None:
    """Rows with field ids, in the table's current schema."""
    schema = table.schema().as_arrow()
    columns = []
    for field in schema:
        if pa.types.is_integer(field.type):
            values: list[Any] = list(range(start, start + rows))
        elif pa.types.is_floating(field.type):
            values = [i / 4 for i in range(start, start + rows)]
        elif pa.types.is_decimal(field.type):
            values = [f"{i % 500}.25" for i in range(start, start + rows)]
        else:
            values = [f"{field.name}-{start}"] * rows  # one partition if partitioned by it
        columns.append(pa.array(values).cast(field.type))
    table.append(pa.Table.from_arrays(columns, schema=schema))


def _java_mapped_rows(table: Table) -> Counter[str]:
    """The current state's rows as Iceberg Java's Parquet reader reads them with the table's
    name mapping (``compactor.readcheck.NameMappedRead``), in canonical form."""
    reader = ensure_reader()
    command = [reader.java, *JVM_OPTIONS, "-cp", reader.classpath]
    done = subprocess.run(
        [*command, "compactor.readcheck.NameMappedRead", table.metadata_location],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return Counter(done.stdout.splitlines())


def _compact(catalog: Catalog, *, java: bool = True) -> tuple[RunResult, Table]:
    """Compact db.t: the same rows before and after, as pyiceberg reads them file by file and,
    with ``java``, as Java reads them through the name mapping."""
    table = catalog.load_table("db.t")
    before = scan_rows(table)
    java_before = _java_mapped_rows(table) if java else None
    if java_before is not None:
        assert java_before == canonical_rows(before, table.schema())

    result, after = run_compaction(catalog, "db.t")

    assert result.to_dict()["rewritten_files"] == len(live_data_files(table))
    assert_same_rows(before, scan_rows(after))
    if java_before is not None:
        assert _java_mapped_rows(after) == java_before
        snapshot = after.current_snapshot()
        assert snapshot is not None
        assert_java_reads_same(after, snapshot_ids=[snapshot.snapshot_id])
    return result, after


def test_renamed_re_added_and_promoted_columns_read_through_the_mapping(
    catalog: Catalog, tmp_path: Path, read_path: str
) -> None:
    """The imported files hold "qty" as int32, "ratio" as float, "price" as decimal(7,2),
    "label" (now "title") and "note" (dropped, then added again: the mapping gives the name to
    the new column, so Java and pyiceberg read the old values into it). Files with field ids
    appended after the changes sit in the same groups."""
    table = catalog.create_table("db.t", SCHEMA)
    _import(table, tmp_path / "imports", range(0, 300, 60))
    with table.update_schema() as update:
        update.rename_column("label", "title")
        update.update_column("qty", LongType())
        update.update_column("ratio", DoubleType())
        update.update_column("price", DecimalType(12, 2))
    with table.update_schema() as update:
        update.delete_column("note")
    with table.update_schema() as update:
        update.add_column("note", StringType())
    table = catalog.load_table("db.t")
    for start in (1000, 1100):
        _append(table, start)
    table = catalog.load_table("db.t")
    mapping = json.loads(table.metadata.properties[NAME_MAPPING])
    assert {"label", "title"} <= set(next(f for f in mapping if f["field-id"] == 5)["names"])
    before = scan_rows(table)
    imported = before.filter(pa.compute.less(before["id"], 1000))
    assert imported.num_rows == 300
    # The mapping's reading: old labels under "title", old notes in the new "note".
    assert imported["title"].null_count == sum(1 for i in range(300) if i % 11 == 0)
    assert imported["note"].null_count == 0
    assert imported.schema.field("qty").type == pa.int64()
    assert imported.schema.field("price").type == pa.decimal128(12, 2)

    result, _ = _compact(catalog)

    assert result.to_dict()["bulk_read_files"] == (7 if read_path != "iceberg" else 0)


def test_the_mapping_is_resolved_once_per_file_schema(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_path: str
) -> None:
    calls: list[pa.Schema] = []
    resolve = file_projection.pyarrow_to_schema

    def counting(schema: pa.Schema, *args: Any, **kwargs: Any) -> Schema:
        calls.append(schema)
        return resolve(schema, *args, **kwargs)

    monkeypatch.setattr(file_projection, "pyarrow_to_schema", counting)
    table = catalog.create_table("db.t", SCHEMA)
    _import(table, tmp_path / "imports", range(0, 480, 60))

    result, _ = _compact(catalog, java=False)

    assert result.to_dict()["rewritten_files"] == 8
    assert len(calls) == (1 if read_path != "iceberg" else 0)


HIVE_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "amount", LongType(), required=False),
)


def _hive_file(table: Table, path: Path, region: str | None, start: int) -> DataFile:
    """A Hive-style file of partition ``region``: the partition column is not in the file."""
    ids = list(range(start, start + 50))
    pq.write_table(pa.table({"id": ids, "amount": [i * 3 for i in ids]}), path)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path.as_uri(),
        file_format=FileFormat.PARQUET,
        partition=Record(region),
        record_count=len(ids),
        file_size_in_bytes=path.stat().st_size,
        sort_order_id=None,
        key_metadata=None,
    )
    data_file.spec_id = table.spec().spec_id
    return data_file


def test_hive_style_files_take_their_identity_partition_column_from_the_partition(
    catalog: Catalog, tmp_path: Path, read_path: str
) -> None:
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    table = catalog.create_table(
        "db.t",
        HIVE_SCHEMA,
        partition_spec=spec,
        properties={NAME_MAPPING: create_mapping_from_schema(HIVE_SCHEMA).model_dump_json()},
    )
    files = [
        _hive_file(table, tmp_path / f"{region}-{start}.parquet", region, start)
        for region in ("east", "west")
        for start in (0, 100, 200)
    ]
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    table = catalog.load_table("db.t")
    ids = list(range(5000, 5040))  # a file with field ids and the column, in one group with them
    rows = {"id": ids, "region": ["west"] * len(ids), "amount": ids}
    table.append(pa.table(rows, schema=table.schema().as_arrow()))

    result, after = _compact(catalog)

    assert result.to_dict()["bulk_read_files"] == (7 if read_path != "iceberg" else 0)
    west = scan_rows(after, "region = 'west'")
    assert west["region"].to_pylist() == ["west"] * 190
    assert sorted(west["id"].to_pylist()) == [*range(50), *range(100, 150), *range(200, 250), *ids]


def test_a_file_whose_names_the_mapping_gives_two_fields_takes_the_iceberg_read_path(
    catalog: Catalog, tmp_path: Path, read_path: str
) -> None:
    """A name listed under two fields: Java refuses such a mapping, pyiceberg takes the first
    field listing it; a scan must not guess, so those files are read each."""
    table = catalog.create_table("db.t", SCHEMA)
    _import(table, tmp_path / "imports", range(0, 180, 60))
    mapping = json.loads(table.metadata.properties[NAME_MAPPING])
    mapping[-1]["names"].append("label")  # "label" also names "note"
    with table.transaction() as tx:
        tx.set_properties({NAME_MAPPING: json.dumps(mapping)})
    table = catalog.load_table("db.t")
    for start in (1000, 1100):
        _append(table, start)

    result, _ = _compact(catalog, java=False)  # Java refuses the mapping

    assert result.to_dict()["bulk_read_files"] == (2 if read_path != "iceberg" else 0)


def test_every_primitive_type_imported_reads_as_java_reads_it(
    catalog: Catalog, tmp_path: Path, read_path: str
) -> None:
    schema = Schema(*[f for f in TYPES_SCHEMA.fields if f.field_type.is_primitive])
    table = catalog.create_table("db.t", schema)
    arrow = pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema.as_arrow()])
    paths = []
    for start in range(0, 1200, 300):
        rng = random.Random(start)
        columns = [
            pa.array([types_value(f.name, i, rng) for i in range(start, start + 300)], f.type)
            for f in arrow
        ]
        path = tmp_path / f"types-{start}.parquet"
        pq.write_table(pa.Table.from_arrays(columns, schema=arrow), path)
        paths.append(path.as_uri())
    table.add_files(paths)

    result, _ = _compact(catalog)

    assert result.to_dict()["bulk_read_files"] == (4 if read_path != "iceberg" else 0)


def test_imported_files_with_position_deletes_are_read_in_bulk_without_the_deleted_rows(
    catalog: Catalog, tmp_path: Path, read_path: str
) -> None:
    table = catalog.create_table("db.t", SCHEMA)
    paths = _import(table, tmp_path / "imports", range(0, 180, 60))
    with table.update_schema() as update:
        update.rename_column("label", "title")
    table = catalog.load_table("db.t")
    victim = live_data_files(table)[paths[1]]
    commit_delete_files(table, [write_position_delete_file(table, {victim: [0, 7, 59]})])

    result, after = _compact(catalog, java=False)  # the Java reader here reads no deletes

    assert result.to_dict()["bulk_read_files"] == (3 if read_path != "iceberg" else 0)
    assert result.to_dict()["deleted_rows_applied"] == 3
    assert not {60, 67, 119} & set(scan_rows(after)["id"].to_pylist())
