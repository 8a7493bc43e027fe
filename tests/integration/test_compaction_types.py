"""Every Iceberg primitive type and the nested types survive compaction unchanged."""

from __future__ import annotations

import datetime as dt
import math
import random
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from support.rows import assert_same_rows, row_multiset, scan_rows
from support.runs import DEFAULT_OPTIONS, EVERY_READ_PATH, compact_and_verify, run_compaction
from support.tables import append_rows, new_data_files, read_data_file

# Every row test here runs with bulk reading on and off.
pytestmark = [
    pytest.mark.usefixtures("read_path"),
    pytest.mark.parametrize("read_path", EVERY_READ_PATH, indirect=True),
]

SCHEMA = Schema(
    NestedField(1, "b", BooleanType()),
    NestedField(2, "i32", IntegerType()),
    NestedField(3, "i64", LongType()),
    NestedField(4, "f32", FloatType()),
    NestedField(5, "f64", DoubleType()),
    NestedField(6, "dec_small", DecimalType(10, 2)),
    NestedField(7, "dec_big", DecimalType(38, 10)),
    NestedField(8, "dt", DateType()),
    NestedField(9, "tm", TimeType()),
    NestedField(10, "ts", TimestampType()),
    NestedField(11, "tstz", TimestamptzType()),
    NestedField(12, "s", StringType()),
    NestedField(13, "u", UUIDType()),
    NestedField(14, "fx", FixedType(16)),
    NestedField(15, "bin", BinaryType()),
    NestedField(
        16,
        "st",
        StructType(
            NestedField(17, "a", IntegerType()),
            NestedField(18, "b", StringType()),
        ),
    ),
    NestedField(19, "ls", ListType(20, LongType(), element_required=False)),
    NestedField(21, "mp", MapType(22, StringType(), 23, DoubleType(), value_required=False)),
)
EPOCH = dt.datetime(1970, 1, 1)
ROWS_PER_APPEND = 400
APPENDS = 5


def _value(name: str, i: int, rng: random.Random) -> Any:
    if i % 9 == 0 and name not in ("i64",):  # nulls in every optional column
        return None
    match name:
        case "b":
            return i % 2 == 0
        case "i32":
            return (-(2**31), 2**31 - 1)[i % 2] if i % 50 == 1 else (i * 7919) % 2**20 - 2**19
        case "i64":
            return (-(2**63), 2**63 - 1)[i % 2] if i % 50 == 1 else i * 1_000_003 - 10**9
        case "f32":
            return (float("nan"), float("inf"), -0.0)[i % 3] if i % 10 == 2 else i / 7
        case "f64":
            return (float("nan"), float("-inf"), 0.0)[i % 3] if i % 10 == 3 else i / 3 - 100
        case "dec_small":
            return Decimal(i * 7919 % 200_000 - 100_000).scaleb(-2)
        case "dec_big":
            return Decimal(f"{'-' if i % 2 else ''}{i:028d}.{(i * 7919) % 10**10:010d}")
        case "dt":
            return dt.date(1950, 1, 1) + dt.timedelta(days=i * 13)
        case "tm":
            return (EPOCH + dt.timedelta(microseconds=i * 9_876_543 % 86_400_000_000)).time()
        case "ts":
            return EPOCH + dt.timedelta(seconds=i * 86_413 - 10**7, microseconds=i)
        case "tstz":
            return dt.datetime(1995, 6, 1, tzinfo=dt.UTC) + dt.timedelta(hours=i * 7)
        case "s":
            return ("", "ab", "abc", "zß", "日本語", "🧊-ice")[i % 6] + str(i)
        case "u":
            return uuid.UUID(int=i * 0x1000193 + 7).bytes
        case "fx":
            return i.to_bytes(4, "big") * 4
        case "bin":
            return rng.randbytes(i % 5 * 8)
        case "st":
            return {"a": None if i % 4 == 0 else i, "b": None if i % 5 == 0 else f"s{i}"}
        case "ls":
            return [] if i % 7 == 0 else [i, None, -i][: 1 + i % 3]
        case "mp":
            return {} if i % 8 == 0 else {f"k{i}": i / 2, "nan": float("nan"), "null": None}
    raise AssertionError(name)


def types_batch(arrow: pa.Schema, start: int, rows: int) -> pa.Table:
    rng = random.Random(start)
    columns = {
        field.name: pa.array(
            [_value(field.name, i, rng) for i in range(start, start + rows)],
            arrow.field(field.name).type,
        )
        for field in SCHEMA.fields
    }
    return pa.table(columns, schema=arrow)


def _build(catalog: Catalog) -> None:
    table = catalog.create_table("db.types", SCHEMA)
    for n in range(APPENDS):
        append_rows(
            table, types_batch(table.schema().as_arrow(), n * ROWS_PER_APPEND, ROWS_PER_APPEND)
        )


@pytest.mark.usefixtures("file_kind")
def test_all_types_round_trip(catalog: Catalog) -> None:
    _build(catalog)
    before = catalog.load_table("db.types")
    rows = scan_rows(before)
    # The data really holds the edge cases the test is about.
    f64 = rows.column("f64").to_pylist()
    assert any(v is not None and math.isnan(v) for v in f64) and None in f64
    assert all(rows.column(n).null_count > 0 for n in rows.column_names if n != "i64")

    _, after, _ = compact_and_verify(catalog, "db.types")

    schema = after.schema()
    for data_file in new_data_files(before, after):
        written = read_data_file(after, data_file)
        assert written.num_rows == data_file.record_count
        assert written.schema.names == [f.name for f in SCHEMA.fields]
        # Column metrics cover the primitive columns, nulls included.
        for name in (
            "b",
            "i32",
            "i64",
            "f64",
            "dec_small",
            "dec_big",
            "dt",
            "tm",
            "ts",
            "tstz",
            "s",
            "fx",
        ):
            field_id = schema.find_field(name).field_id
            assert data_file.value_counts[field_id] == data_file.record_count, name
            assert data_file.null_value_counts[field_id] == written.column(name).null_count, name
            assert data_file.lower_bounds[field_id] is not None, name
            assert data_file.upper_bounds[field_id] is not None, name


PRIMITIVES = [f.name for f in SCHEMA.fields if f.field_type.is_primitive]


@pytest.mark.parametrize(
    "options",
    [
        {"strategy": "sort", "sort_order": ", ".join(f"{n} DESC" for n in PRIMITIVES)},
        {"strategy": "zorder", "zorder": ", ".join(PRIMITIVES)},
    ],
    ids=["sort", "zorder"],
)
def test_every_primitive_type_sorts_and_zorders(catalog: Catalog, options: dict[str, str]) -> None:
    """Every primitive column in one order or z-order key at once: uuids, longs beyond 2**53
    and fixed values sharing their first bytes included."""
    _build(catalog)
    compact_and_verify(catalog, "db.types", **options)


FILTERS: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]] = {
    "long-range": (
        "i64 >= 0 and i64 < 500000000",
        lambda r: r["i64"] is not None and 0 <= r["i64"] < 500_000_000,
    ),
    "int-in": (
        "i32 in (-508450, -500531, 2147483647)",
        lambda r: r["i32"] in (-508450, -500531, 2147483647),
    ),
    "bool": ("b = true", lambda r: r["b"] is True),
    "double-nan": ("f64 is nan", lambda r: r["f64"] is not None and math.isnan(r["f64"])),
    "double-null": ("f64 is null", lambda r: r["f64"] is None),
    "float-gt": ("f32 > 100.5", lambda r: r["f32"] is not None and r["f32"] > 100.5),
    "decimal": (
        "dec_small > 500.25",
        lambda r: r["dec_small"] is not None and r["dec_small"] > Decimal("500.25"),
    ),
    "date": (
        "dt >= '1990-01-01' and dt < '2000-01-01'",
        lambda r: r["dt"] is not None and dt.date(1990, 1, 1) <= r["dt"] < dt.date(2000, 1, 1),
    ),
    "timestamptz": (
        "tstz < '1996-01-01T00:00:00+00:00'",
        lambda r: r["tstz"] is not None and r["tstz"] < dt.datetime(1996, 1, 1, tzinfo=dt.UTC),
    ),
    "string-prefix": ("s like 'ab%'", lambda r: r["s"] is not None and r["s"].startswith("ab")),
    "string-eq": ("s = 'abc1004'", lambda r: r["s"] == "abc1004"),
}


@pytest.fixture(scope="module")
def compacted_by_read_path() -> dict[str, tuple[SqlCatalog, int]]:
    """The types table compacted on each read path, once for all the module's filters."""
    return {}


@pytest.fixture
def compacted_types(
    read_path: str,
    compacted_by_read_path: dict[str, tuple[SqlCatalog, int]],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[SqlCatalog, int]:
    """The types table compacted on the test's read path; the catalog and the snapshot before."""
    if read_path in compacted_by_read_path:
        return compacted_by_read_path[read_path]
    root: Path = tmp_path_factory.mktemp("types")
    catalog = SqlCatalog(
        "default", uri=f"sqlite:///{root}/catalog.db", warehouse=(root / "wh").as_uri()
    )
    catalog.create_namespace("db")
    _build(catalog)
    before_id = catalog.load_table("db.types").metadata.current_snapshot_id
    assert before_id is not None
    # A small target makes several output files, so metric-based pruning matters.
    result, table = run_compaction(
        catalog, "db.types", **{**DEFAULT_OPTIONS, "target_file_size": "64KiB"}
    )
    assert result.to_dict()["snapshot_id"] == table.metadata.current_snapshot_id
    assert result.to_dict()["added_files"] > 1
    assert (result.to_dict()["bulk_read_files"] > 0) == (read_path != "iceberg")
    compacted_by_read_path[read_path] = catalog, before_id
    return catalog, before_id


@pytest.mark.parametrize("name", list(FILTERS))
def test_row_filter_after_compaction(compacted_types: tuple[SqlCatalog, int], name: str) -> None:
    catalog, before_id = compacted_types
    expression, predicate = FILTERS[name]
    table = catalog.load_table("db.types")
    everything = table.scan(snapshot_id=before_id).to_arrow()
    expected = everything.filter(
        pa.array([predicate(r) for r in everything.to_pylist()], pa.bool_())
    )
    assert 0 < expected.num_rows < everything.num_rows  # the filter is selective

    before = table.scan(snapshot_id=before_id, row_filter=expression).to_arrow()
    after = scan_rows(table, expression)
    assert row_multiset(before) == row_multiset(expected)
    assert_same_rows(expected, after)
