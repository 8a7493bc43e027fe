"""Files written under older schemas, or without field ids, are read correctly by compaction."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import NameMapping
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
)

from support.rows import scan_rows
from support.runs import EVERY_READ_PATH, compact_and_verify
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    append_rows,
    live_data_files,
    new_data_files,
    read_data_file,
)

# Every row test here runs with bulk reading on and off.
pytestmark = [
    pytest.mark.usefixtures("read_path"),
    pytest.mark.parametrize("read_path", EVERY_READ_PATH, indirect=True),
]

FIELD_ID = b"PARQUET:field_id"


def _append(table: Table, start: int, rows: int = 150) -> None:
    """Append rows in the table's current schema, filling every column it has now."""
    columns: dict[str, list] = {}
    for field in table.schema().fields:
        values: list = []
        for i in range(start, start + rows):
            if field.name == "id":
                values.append(i)
            elif field.name == "score":
                values.append(float("nan") if i % 17 == 0 else None if i % 19 == 0 else i / 8)
            elif field.name == "keep":
                values.append(("red", "green")[i % 2])
            else:
                values.append(None if i % 13 == 0 else f"{field.name}-{i}")
        columns[field.name] = values
    append_rows(table, pa.table(columns, schema=table.schema().as_arrow()))


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize(
    ("partitioned", "file_kind"),
    [(False, FIELD_IDS), (True, FIELD_IDS), (True, IMPORTED)],
    ids=["unpartitioned", "identity", "identity-imported"],
    indirect=["file_kind"],
)
def test_files_of_older_schemas(catalog: Catalog, partitioned: bool) -> None:
    schema = Schema(
        NestedField(1, "id", IntegerType(), required=True),
        NestedField(2, "score", FloatType(), required=False),
        NestedField(3, "old_name", StringType(), required=False),
        NestedField(4, "dropme", StringType(), required=False),
        NestedField(5, "keep", StringType(), required=False),
    )
    spec = (
        PartitionSpec(PartitionField(5, 1000, IdentityTransform(), "keep"))
        if partitioned
        else UNPARTITIONED_PARTITION_SPEC
    )
    table = catalog.create_table("db.t", schema, partition_spec=spec)
    start = 0

    def append_twice() -> None:
        nonlocal start
        for _ in range(2):
            _append(table, start)
            start += 150

    append_twice()
    with table.update_schema() as update:
        update.add_column("extra", StringType())
    append_twice()
    with table.update_schema() as update:
        update.rename_column("old_name", "new_name")
    append_twice()
    with table.update_schema() as update:
        update.delete_column("dropme")
    append_twice()
    with table.update_schema() as update:
        update.update_column("id", LongType())
        update.update_column("score", DoubleType())
    append_twice()

    before = catalog.load_table("db.t")
    assert len(before.metadata.schemas) == 5
    rows = scan_rows(before)
    # The projection really exercises old files: nulls for 'extra', widened values, renamed data.
    assert rows.column("extra").null_count >= 300
    assert rows.column("new_name").null_count < rows.num_rows // 4
    assert "dropme" not in rows.column_names

    _, after, _ = compact_and_verify(catalog, "db.t")

    current = after.schema()
    for data_file in new_data_files(before, after):
        written = read_data_file(after, data_file).schema
        assert written.names == ["id", "score", "new_name", "keep", "extra"]
        assert written.field("id").type == pa.int64()
        assert written.field("score").type == pa.float64()
        ids = [int(written.field(n).metadata[FIELD_ID]) for n in written.names]
        assert ids == [current.find_field(n).field_id for n in written.names]


def _plain_parquet(path: Path, start: int, rows: int) -> str:
    """A Parquet file written by plain pyarrow: no Iceberg field ids."""
    ids = range(start, start + rows)
    columns = {
        "id": pa.array(ids, pa.int64()),
        "label": pa.array([None if i % 11 == 0 else f"label-{i}" for i in ids]),
        "amount": pa.array([float("nan") if i % 23 == 0 else i * 1.5 for i in ids]),
    }
    data = pa.table(columns)
    assert all(field.metadata is None for field in data.schema)
    pq.write_table(data, path)
    return path.as_uri()


def test_add_files_read_by_name_mapping(catalog: Catalog, tmp_path: Path) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "label", StringType(), required=False),
        NestedField(3, "amount", DoubleType(), required=False),
    )
    table = catalog.create_table("db.t", schema)
    imports = tmp_path / "imports"
    imports.mkdir()
    paths = [_plain_parquet(imports / f"part-{n}.parquet", n * 200, 200) for n in range(4)]
    table.add_files(paths)
    table.append(
        pa.table(
            {"id": [10_000, 10_001], "label": ["appended", None], "amount": [1.0, None]},
            schema=schema.as_arrow(),
        )
    )
    # Renaming updates the name mapping, so the imported files can only be read through it.
    with table.update_schema() as update:
        update.rename_column("label", "title")
    table = catalog.load_table("db.t")
    mapping = NameMapping.model_validate_json(
        table.metadata.properties["schema.name-mapping.default"]
    )
    assert {"label", "title"} <= set(next(f for f in mapping.root if f.field_id == 2).names)
    rows = scan_rows(table)
    assert rows.num_rows == 802
    # Read through the mapping: the imported labels are there under the new name.
    assert rows.column("title").null_count == sum(1 for i in range(800) if i % 11 == 0) + 1

    assert set(paths) < set(live_data_files(table))

    _, after, _ = compact_and_verify(catalog, "db.t")

    # The imported files were rewritten into files with field ids of the current schema.
    assert not set(paths) & set(live_data_files(after))
    for data_file in new_data_files(table, after):
        written = read_data_file(after, data_file).schema
        assert written.names == ["id", "title", "amount"]
        assert [int(written.field(n).metadata[FIELD_ID]) for n in written.names] == [1, 2, 3]
    hit = scan_rows(after, "title = 'label-401'")
    assert hit.to_pylist() == [{"id": 401, "title": "label-401", "amount": 601.5}]
