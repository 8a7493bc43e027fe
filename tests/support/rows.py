"""Rows compared as Iceberg Java compares them: a multiset of canonical rows, NaN-safe."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table


def _canon(value: Any) -> Any:
    """A hashable, equality-faithful form of one value (NaN equals NaN, -0.0 is not 0.0, nested
    types flattened), as Iceberg Java compares values."""
    if isinstance(value, float):
        return ("float", "nan") if math.isnan(value) else ("float", value, math.copysign(1, value))
    if isinstance(value, dict):  # struct
        return ("struct", tuple((k, _canon(v)) for k, v in sorted(value.items())))
    if isinstance(value, list | tuple):  # list, or map as a list of (key, value) pairs
        return ("seq", tuple(_canon(v) for v in value))
    return value


def _canon_column(column: pa.ChunkedArray) -> list[Any]:
    """:func:`_canon` of each value of one column (integers, strings, booleans need none)."""
    kind = column.type
    values = column.to_pylist()
    t = pa.types
    if any(f(kind) for f in (t.is_integer, t.is_string, t.is_large_string, t.is_boolean)):
        return values
    return [_canon(v) for v in values]


def row_multiset(data: pa.Table) -> Counter[tuple[Any, ...]]:
    """Every row of ``data`` as a canonical tuple, counted."""
    if not data.num_columns:
        return Counter({(): data.num_rows}) if data.num_rows else Counter()
    return Counter(zip(*(_canon_column(c) for c in data.columns), strict=True))


def assert_same_rows(before: pa.Table, after: pa.Table) -> None:
    """The two tables hold exactly the same multiset of rows, under the same schema."""
    assert after.schema.equals(before.schema), (
        f"schema changed:\n{before.schema}\n!=\n{after.schema}"
    )
    assert after.num_rows == before.num_rows, (
        f"{before.num_rows} rows before, {after.num_rows} after"
    )
    b, a = row_multiset(before), row_multiset(after)
    if a != b:
        missing = list((b - a).items())[:5]
        extra = list((a - b).items())[:5]
        raise AssertionError(f"rows differ: missing {missing} ... extra {extra} ...")


def scan_rows(table: Table, row_filter: str | BooleanExpression | None = None) -> pa.Table:
    """Everything the current snapshot returns (after deletes), optionally filtered."""
    if row_filter is None:
        return table.scan().to_arrow()
    return table.scan(row_filter=row_filter).to_arrow()
