"""Sort keys compare bytewise in the order asked for, for every type a sort column can have."""

from __future__ import annotations

import datetime as dt
import math
import os
import tempfile
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from compactor.planning.sort_order import Clustering, SortField
from compactor.rewrite.sort_keys import _field_key, interleave
from compactor.rewrite.sorting import SortingWriter

RNG = np.random.default_rng(11)
N = 400
UTC = dt.UTC


def _values(kind: str) -> tuple[pa.DataType, IcebergType, list[Any]]:
    ints = RNG.integers(-(2**40), 2**40, N).tolist()
    if kind == "long":
        return pa.int64(), LongType(), ints + [-(2**63), 2**63 - 1, 0, -1]
    if kind == "int":
        return pa.int32(), IntegerType(), [v % 2**31 - 2**30 for v in ints]
    if kind == "double":
        special = [math.inf, -math.inf, math.nan, 0.0, -0.0, 5e-324, -5e-324]
        return pa.float64(), DoubleType(), RNG.normal(0, 1e6, N).tolist() + special
    if kind == "float":
        return pa.float32(), FloatType(), [float(np.float32(v)) for v in RNG.normal(0, 1e3, N)]
    if kind == "decimal":
        return (
            pa.decimal128(20, 3),
            DecimalType(20, 3),
            [Decimal(int(v)).scaleb(-3) for v in RNG.integers(-(10**15), 10**15, N)],
        )
    if kind == "string":
        words = ["", "a", "a\x00", "a\x00b", "ab", "b", "é", "\x00", "zz\x00\x00"]
        return (
            pa.string(),
            StringType(),
            [words[i] for i in RNG.integers(0, len(words), N)]
            + ["".join(chr(c) for c in RNG.integers(0, 300, 5)) for _ in range(N)],
        )
    if kind == "binary":
        return (
            pa.binary(),
            BinaryType(),
            [bytes(RNG.integers(0, 256, int(n), dtype=np.uint8)) for n in RNG.integers(0, 4, N)],
        )
    if kind == "fixed":
        return (
            pa.binary(3),
            FixedType(3),
            [bytes(RNG.integers(0, 256, 3, dtype=np.uint8)) for _ in range(N)],
        )
    if kind == "bool":
        return pa.bool_(), BooleanType(), [bool(v) for v in RNG.integers(0, 2, N)]
    if kind == "date":
        return (
            pa.date32(),
            DateType(),
            [dt.date(1970, 1, 1) + dt.timedelta(days=int(v)) for v in RNG.integers(-9000, 9000, N)],
        )
    if kind == "timestamp":
        return (
            pa.timestamp("us"),
            TimestampType(),
            [dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=int(v)) for v in ints],
        )
    if kind == "time":
        micros = RNG.integers(0, 86_400_000_000, N).tolist()
        return (
            pa.time64("us"),
            TimeType(),
            [(dt.datetime.min + dt.timedelta(microseconds=m)).time() for m in micros],
        )
    if kind == "uuid":
        # Halves with and without their top bit set: Java's signed order differs from bytes'.
        return pa.uuid(), UUIDType(), [uuid.UUID(bytes=RNG.bytes(16)) for _ in range(N)]
    assert kind == "timestamptz"
    return (
        pa.timestamp("us", tz="UTC"),
        TimestamptzType(),
        [dt.datetime(2000, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=int(v)) for v in ints],
    )


def _python_key(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return (1, 0.0)  # NaN after every number
    if isinstance(value, float):
        return (0, value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, uuid.UUID):  # java.util.UUID.compareTo: two signed longs
        halves = value.bytes[:8], value.bytes[8:]
        return tuple(int.from_bytes(half, "big", signed=True) for half in halves)
    return value


def _arrow(values: list[Any], arrow_type: pa.DataType) -> pa.Array:
    """``values`` as an array (Arrow's uuid type takes uuids as their bytes)."""
    return pa.array([v.bytes if isinstance(v, uuid.UUID) else v for v in values], arrow_type)


KINDS = [
    "long",
    "int",
    "double",
    "float",
    "decimal",
    "string",
    "binary",
    "fixed",
    "bool",
    "date",
    "timestamp",
    "timestamptz",
    "time",
    "uuid",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("descending", "nulls_first"), [(False, True), (False, False), (True, True), (True, False)]
)
def test_key_order_is_the_value_order(kind: str, descending: bool, nulls_first: bool) -> None:
    arrow_type, iceberg_type, values = _values(kind)
    values = values + [None] * 20
    order = RNG.permutation(len(values))
    values = [values[i] for i in order]
    field = SortField("c", 1, "identity", descending, nulls_first)
    keys = _field_key(_arrow(values, arrow_type), field, iceberg_type).to_pylist()

    by_key = [v for _, v in sorted(zip(keys, values, strict=True), key=lambda kv: kv[0])]

    present = sorted((v for v in values if v is not None), key=_python_key, reverse=descending)
    nulls = [None] * values.count(None)
    expected = nulls + present if nulls_first else present + nulls
    assert [_python_key(v) if v is not None else None for v in by_key] == [
        _python_key(v) if v is not None else None for v in expected
    ]


def test_transforms_order_by_the_transformed_value_then_nothing_else() -> None:
    days = [dt.datetime(2026, 1, d, h) for d in (3, 1, 2) for h in (23, 0)]
    field = SortField("at", 1, "day")
    keys = _field_key(pa.array(days, pa.timestamp("us")), field, TimestampType()).to_pylist()
    assert len(set(keys)) == 3 and keys[0] == keys[1] > keys[4] > keys[2]
    truncated = _field_key(
        pa.array(["abcz", "abca", "abd"]), SortField("s", 1, "truncate[3]"), StringType()
    ).to_pylist()
    assert truncated[0] == truncated[1] < truncated[2]


def test_interleave_puts_each_columns_top_bit_first() -> None:
    a = np.array([0b10, 0b00, 0b01], dtype=np.uint64)
    b = np.array([0b00, 0b10, 0b11], dtype=np.uint64)
    z = interleave([a, b], bits=2)
    assert [int(v) >> 60 for v in z] == [0b1000, 0b0100, 0b0111]


class _Collect:
    """Stands in for the Parquet writer: keeps the batches it is given, in order."""

    def __init__(self, schema: pa.Schema) -> None:
        self.arrow_schema, self.batches = schema, []

    def to_output(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch

    def write(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def close(self) -> list:
        return []

    def abort(self) -> None:
        pass


def _draws(rng: np.random.Generator, n: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.random(n), rng.integers(-high, high, n)


def test_runs_spilled_to_disk_merge_in_several_passes_into_one_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 KiB runs: hundreds of them, merged two at a time, then into the writer."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    # tempfile caches the directory it found first: forget it for this test only, or every
    # later test of this process would make its temporary files here.
    monkeypatch.setattr(tempfile, "tempdir", None)
    schema = pa.schema(
        [
            pa.field("y", pa.int64(), metadata={b"PARQUET:field_id": b"1"}),
            pa.field("name", pa.string(), metadata={b"PARQUET:field_id": b"2"}),
            pa.field("v", pa.float64(), metadata={b"PARQUET:field_id": b"3"}),
        ]
    )
    iceberg = Schema(
        NestedField(1, "y", LongType()),
        NestedField(2, "name", StringType()),
        NestedField(3, "v", DoubleType()),
    )
    clustering = Clustering(
        "sort",
        (
            SortField("y", 1, descending=True, nulls_first=False),
            SortField("name", 2, nulls_first=True),
        ),
    )
    rng = np.random.default_rng(5)
    sink = _Collect(schema)
    sorter = SortingWriter(sink, clustering, iceberg, [], memory=64 * 1024)  # type: ignore[arg-type]
    rows = []
    spilled = set()
    for _ in range(40):
        n = 1000
        ys = [int(v) if r > 0.05 else None for r, v in zip(*_draws(rng, n, 50), strict=True)]
        names = [
            f"k\x00{v}" if r > 0.05 else None for r, v in zip(*_draws(rng, n, 99), strict=True)
        ]
        vs = rng.random(n).tolist()
        rows += zip(ys, names, vs, strict=True)
        sorter.write(pa.record_batch([ys, names, vs], schema=schema))
        spilled |= set(os.listdir(sorter._directory or tmp_path))
    assert len(spilled) >= 16, "rows must have been spilled in many runs (merged 2 at a time)"
    sorter.close()

    written = [r for b in sink.batches for r in zip(*b.to_pydict().values(), strict=True)]
    assert sorted(written, key=repr) == sorted(rows, key=repr)

    def expected(row: tuple) -> tuple:
        y, name, _ = row
        return (y is None, -(y or 0), name is not None, name or "")

    assert [expected(r) for r in written] == sorted(expected(r) for r in rows)
    assert list(tmp_path.iterdir()) == [], "spilled runs are removed"
