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
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
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


NESTED = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(
        2,
        "point",
        StructType(
            NestedField(3, "x", LongType(), required=False),
            NestedField(4, "name", StringType(), required=False),
        ),
        required=False,
    ),
    NestedField(5, "tags", ListType(6, LongType(), element_required=False), required=False),
    NestedField(
        7,
        "attrs",
        MapType(
            8,
            StringType(),
            9,
            StructType(NestedField(10, "n", DoubleType(), required=False)),
            value_required=False,
        ),
        required=False,
    ),
)
NESTED_EXPECTED = schema_to_pyarrow(NESTED, include_field_ids=True)


def _with_id(field_id: int, name: str, kind: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, kind, nullable, metadata={FIELD_ID: str(field_id).encode()})


def _nested_file(point: list[pa.Field], tags: pa.DataType | None = None) -> pa.Schema:
    """A file of NESTED with field ids: ``point``'s fields as given, "tags" of ``tags``."""
    attrs = pa.map_(
        _with_id(8, "key", pa.string(), nullable=False),
        _with_id(9, "value", pa.struct([_with_id(10, "n", pa.float32())])),
    )
    return pa.schema(
        [
            _with_id(1, "id", pa.int64(), nullable=False),
            _with_id(2, "point", pa.struct(point)),
            _with_id(5, "tags", pa.list_(_with_id(6, "element", tags or pa.int32()))),
            _with_id(7, "attrs", attrs),
        ]
    )


def _nested_resolver(schema: Schema = NESTED, mapping: NameMapping | None = None) -> Resolver:
    expected = schema_to_pyarrow(schema, include_field_ids=True)
    return Resolver(expected, schema, {0: PartitionSpec()}, mapping, 2)


def test_nested_fields_are_renamed_widened_and_filled_by_field_id() -> None:
    """The file's "point.label" is "point.name" now, "point.x" was added since and "point.gone"
    dropped, "tags" held ints and "attrs" floats: the scan type keeps the file's names."""
    physical = _nested_file([_with_id(4, "label", pa.string()), _with_id(99, "gone", pa.int8())])

    projection = _nested_resolver().projection(physical, 0)

    assert projection is not None
    point = projection.scan.field("point").type
    assert [f.name for f in point.fields] == ["x#3", "label"]  # the cast fills "x#3" with nulls
    assert projection.scan.field("tags").type.value_type == pa.int64()
    assert projection.scan.field("attrs").type.item_type.field(0).type == pa.float64()
    scanned = pa.array([{"label": "a", "gone": 1}, None], physical.field("point").type).cast(point)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([1, 2], pa.int64()),
            scanned,
            pa.array([[1], None], projection.scan.field("tags").type),
            pa.array([[("k", {"n": 0.5})], None], projection.scan.field("attrs").type),
        ],
        schema=projection.scan,
    )
    filled = fill(batch, {}, NESTED_EXPECTED)
    assert filled.schema.equals(NESTED_EXPECTED, check_metadata=True)
    assert filled.column(1).to_pylist() == [{"x": None, "name": "a"}, None]


def _point_mapping(x: list[str], name: list[str]) -> NameMapping:
    """A name mapping of NESTED's "id" and "point", its fields 3 and 4 under those names."""
    return NameMapping(
        [
            MappedField(field_id=1, names=["id"]),
            MappedField(
                field_id=2,
                names=["point"],
                fields=[MappedField(field_id=3, names=x), MappedField(field_id=4, names=name)],
            ),
        ]
    )


def test_a_nested_field_without_ids_is_read_through_the_mappings_nested_names() -> None:
    mapping = _point_mapping(["x"], ["label", "name"])
    schema = Schema(*NESTED.fields[:2])
    physical = pa.schema(
        [("id", pa.int64()), ("point", pa.struct([("label", pa.string()), ("x", pa.int32())]))]
    )

    projection = _nested_resolver(schema, mapping).projection(physical, 0)

    assert projection is not None
    assert projection.scan.field("point").type == pa.struct(
        [("x", pa.int64()), ("label", pa.large_string())]
    )


@pytest.mark.parametrize(
    ("point", "tags"),
    [
        pytest.param([_with_id(3, "x", pa.string())], pa.int32(), id="nested not a promotion"),
        pytest.param([_with_id(4, "name", pa.string())], pa.string(), id="element not a promotion"),
        pytest.param(
            [_with_id(3, "x", pa.int64()), _with_id(3, "y", pa.int64())],
            pa.int64(),
            id="two nested fields one id",
        ),
        pytest.param(
            [_with_id(3, "x", pa.int64()), _with_id(4, "x", pa.string())],
            pa.int64(),
            id="one nested name twice",
        ),
        pytest.param(
            [_with_id(3, "x", pa.struct([_with_id(11, "y", pa.int64())]))],
            pa.int64(),
            id="struct for a primitive",
        ),
    ],
)
def test_nested_fields_needing_more_than_a_scan_have_no_projection(
    point: list[pa.Field], tags: pa.DataType
) -> None:
    assert _nested_resolver().projection(_nested_file(point, tags), 0) is None


def test_a_missing_required_nested_field_has_no_projection() -> None:
    point = NESTED.find_field(2).field_type
    required = StructType(point.fields[0], NestedField(4, "name", StringType(), required=True))
    schema = Schema(NESTED.fields[0], NestedField(2, "point", required, required=False))

    physical = pa.schema(
        [
            _with_id(1, "id", pa.int64(), nullable=False),
            _with_id(2, "point", pa.struct([_with_id(3, "x", pa.int64())])),
        ]
    )

    assert _nested_resolver(schema).projection(physical, 0) is None


def test_a_nested_name_the_mapping_gives_two_fields_has_no_projection() -> None:
    mapping = _point_mapping(["x", "name"], ["name"])
    physical = pa.schema([("id", pa.int64()), ("point", pa.struct([("name", pa.string())]))])

    assert _nested_resolver(Schema(*NESTED.fields[:2]), mapping).projection(physical, 0) is None
