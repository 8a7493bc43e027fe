"""File schemas resolved to the written schema: by field id or name mapping, once each."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import MappedField, NameMapping
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
)

from compactor.rewrite.file_projection import FIELD_ID, Resolver, fill

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ratio", DoubleType(), required=False),
    NestedField(3, "price", DecimalType(12, 2), required=False),
    NestedField(4, "title", StringType(), required=False),
    NestedField(5, "region", StringType(), required=False),
)
MAPPING = NameMapping(
    [
        MappedField(field_id=1, names=["id"]),
        MappedField(field_id=2, names=["ratio"]),
        MappedField(field_id=3, names=["price"]),
        MappedField(field_id=4, names=["label", "title"]),
        MappedField(field_id=5, names=["region"]),
    ]
)
SPEC = PartitionSpec(PartitionField(5, 1000, IdentityTransform(), "region"), spec_id=1)
EXPECTED = schema_to_pyarrow(SCHEMA, include_field_ids=True)


def _resolver(mapping: NameMapping | None = MAPPING) -> Resolver:
    return Resolver(EXPECTED, SCHEMA, {0: PartitionSpec(), 1: SPEC}, mapping, 2)


def _file(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    """A file schema without field ids."""
    return pa.schema([pa.field(name, kind) for name, kind in fields])


IMPORTED = _file(
    ("id", pa.int64()),
    ("ratio", pa.float32()),
    ("price", pa.decimal128(7, 2)),
    ("label", pa.string()),
)


def test_columns_are_renamed_and_widened_by_the_mapping() -> None:
    projection = _resolver().projection(IMPORTED, 0)

    assert projection is not None
    assert projection.scan.names[:4] == ["id", "ratio", "price", "label"]
    assert projection.scan.types == EXPECTED.types  # the scan casts to the written types
    assert projection.scan.field(4).name not in IMPORTED.names  # "region": nulls
    assert projection.partition_columns == ()


def test_a_file_schema_is_resolved_once() -> None:
    resolver = _resolver()
    first = resolver.projection(IMPORTED, 0)
    again = resolver.projection(_file(*zip(IMPORTED.names, IMPORTED.types, strict=True)), 0)

    assert again is first and resolver.resolved() == 1


@pytest.mark.parametrize(
    "physical",
    [
        pytest.param(_file(("id", pa.int64()), ("ratio", pa.string())), id="not a promotion"),
        pytest.param(_file(("id", pa.int32()), ("price", pa.decimal128(7, 3))), id="scale"),
        pytest.param(
            _file(("id", pa.int64()), ("label", pa.string()), ("title", pa.string())),
            id="two columns one id",
        ),
        pytest.param(_file(("ratio", pa.float64())), id="required column missing"),
        pytest.param(_file(("id", pa.int64()), ("id", pa.int64())), id="one name twice"),
        pytest.param(_file(("id", pa.int64()), ("unmapped", pa.int64())), id="unmapped column"),
    ],
)
def test_files_needing_more_than_a_scan_have_no_projection(physical: pa.Schema) -> None:
    assert _resolver().projection(physical, 0) is None


def test_a_name_the_mapping_gives_two_fields_has_no_projection() -> None:
    mapping = NameMapping([*MAPPING.root[:4], MappedField(field_id=5, names=["region", "label"])])

    assert _resolver(mapping).projection(IMPORTED, 0) is None


def test_field_ids_win_over_the_mapping() -> None:
    """A file with field ids is read by them, whatever its names say."""
    physical = pa.schema(
        [
            pa.field("id", pa.int64(), metadata={FIELD_ID: b"1"}),
            pa.field("region", pa.string(), metadata={FIELD_ID: b"4"}),  # id 4: "title"
        ]
    )
    projection = _resolver().projection(physical, 0)

    assert projection is not None
    assert projection.scan.names[3] == "region"
    assert projection.scan.field(4).name not in physical.names


def test_a_missing_identity_partition_column_takes_the_partition_value() -> None:
    projection = _resolver().projection(IMPORTED, 1)
    assert projection is not None
    data_file = DataFile.from_args(partition=Record("west"), spec_id=1)

    constants = projection.constants(data_file, EXPECTED)

    assert constants is not None
    assert projection.partition_columns == ((4, 0),)
    scanned = pa.RecordBatch.from_pylist(
        [{"id": 1, "ratio": 0.5, "price": None, "label": "x", "region#5": None}],
        schema=projection.scan,
    )
    filled = fill(scanned, constants, EXPECTED)
    assert filled.schema.equals(EXPECTED, check_metadata=True)
    assert filled.column(4).to_pylist() == ["west"]
    assert filled.column(3).to_pylist() == ["x"]
