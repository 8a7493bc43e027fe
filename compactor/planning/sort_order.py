"""The order a sort or z-order rewrite writes rows in: parsed, resolved against a table.

``--sort-order`` takes Spark's syntax, ``"col ASC NULLS LAST, col2 DESC"`` (direction ASC by
default; nulls first for ASC and last for DESC by default, as in Iceberg and Spark);
``--zorder`` a list of columns. Without ``--sort-order``, ``strategy sort`` uses the table's own
sort order, whose fields may also use the ``year``, ``month``, ``day``, ``hour`` and
``truncate[W]`` transforms (``bucket`` cannot be sorted by: compactor refuses it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    DecimalType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
)

from compactor.errors import UsageError

SORT_ORDER_EXAMPLE = "event_time ASC NULLS LAST, region DESC"
_FIELD = re.compile(
    r"^\s*(?P<column>[^\s,]+|`[^`]+`)(?:\s+(?P<direction>ASC|DESC))?"
    r"(?:\s+NULLS\s+(?P<nulls>FIRST|LAST))?\s*$",
    re.IGNORECASE,
)
_TIME_UNITS = {YearTransform: "year", MonthTransform: "month", DayTransform: "day"}


@dataclass(frozen=True)
class SortField:
    """Sort by a top-level column (its current name and field id), optionally transformed."""

    column: str
    field_id: int
    transform: str = "identity"  # identity, year, month, day, hour or truncate[W]
    descending: bool = False
    nulls_first: bool = True

    def describe(self) -> str:
        key = self.column if self.transform == "identity" else f"{self.transform}({self.column})"
        direction = "DESC" if self.descending else "ASC"
        return f"{key} {direction} NULLS {'FIRST' if self.nulls_first else 'LAST'}"


@dataclass(frozen=True)
class Clustering:
    """How a group's rows are ordered before they are written.

    ``sort_order_id`` is the table's sort order the files are written in (recorded in their
    manifest entries), or None when the order is none of the table's (an explicit order that
    matches none, and z-order).
    """

    strategy: Literal["sort", "zorder"]
    fields: tuple[SortField, ...]
    sort_order_id: int | None = None

    def describe(self) -> str:
        if self.strategy == "zorder":
            return f"zorder({', '.join(f.column for f in self.fields)})"
        return ", ".join(f.describe() for f in self.fields)

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "sort_order_id": self.sort_order_id,
            "fields": [
                [f.column, f.field_id, f.transform, f.descending, f.nulls_first]
                for f in self.fields
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Clustering:
        return cls(
            strategy=data["strategy"],
            fields=tuple(SortField(*f) for f in data["fields"]),
            sort_order_id=data["sort_order_id"],
        )


def parse_sort_order(text: str, option: str = "sort_order") -> list[tuple[str, bool, bool]]:
    """``"a ASC NULLS LAST, b DESC"`` -> [(column, descending, nulls_first)]; syntax only."""
    fields = []
    for part in text.split(","):
        match = _FIELD.match(part)
        if not match or not part.strip():
            raise UsageError(
                f"{option} {text!r}: expected columns with optional ASC|DESC and NULLS "
                f'FIRST|LAST, separated by commas (example: "{SORT_ORDER_EXAMPLE}")',
                option,
            )
        descending = (match["direction"] or "ASC").upper() == "DESC"
        nulls = match["nulls"]
        nulls_first = nulls.upper() == "FIRST" if nulls else not descending
        fields.append((match["column"].strip("`"), descending, nulls_first))
    return fields


def parse_columns(text: str, option: str = "zorder") -> list[str]:
    """``"a, b"`` -> ["a", "b"]; at least one column, none twice."""
    columns = [c.strip().strip("`") for c in text.split(",")]
    if not all(columns) or len(set(columns)) != len(columns):
        raise UsageError(
            f"{option} {text!r}: expected distinct column names separated by commas", option
        )
    return columns


def _column(schema: Schema, table: str, name: str, option: str) -> NestedField:
    try:
        column = schema.find_field(name, case_sensitive=True)
    except ValueError:
        known = ", ".join(f.name for f in schema.fields)
        raise UsageError(
            f"table {table}: {option}: no column {name!r} (columns: {known})", option
        ) from None
    top_level = {f.field_id for f in schema.fields}
    if column.field_id not in top_level or not isinstance(column.field_type, PrimitiveType):
        raise UsageError(
            f"table {table}: {option}: column {name!r} is not a top-level column of a "
            f"primitive type",
            option,
        )
    return column


def _transform_name(transform: Transform[Any, Any]) -> str | None:
    if isinstance(transform, IdentityTransform):
        return "identity"
    if isinstance(transform, HourTransform):
        return "hour"
    if isinstance(transform, TruncateTransform):
        return f"truncate[{transform.width}]"
    for kind, name in _TIME_UNITS.items():
        if isinstance(transform, kind):
            return name
    return None


def _table_order(metadata: TableMetadata, table: str) -> tuple[SortOrder, list[SortField]]:
    order = metadata.sort_order_by_id(metadata.default_sort_order_id)
    if order is None or order.is_unsorted:
        raise UsageError(
            f"table {table}: has no sort order: give one with sort_order "
            f'(example: "{SORT_ORDER_EXAMPLE}")',
            "sort_order",
            "strategy",
        )
    schema = metadata.schema()
    fields = []
    for field in order.fields:
        if isinstance(field.transform, VoidTransform):
            continue
        name = schema.find_column_name(field.source_id)
        column = _column(schema, table, name or str(field.source_id), "sort order")
        transform = _transform_name(field.transform)
        truncatable = (IntegerType, LongType, StringType, BinaryType, DecimalType)
        if (
            transform
            and transform.startswith("truncate")
            and not isinstance(column.field_type, truncatable)
        ):
            transform = None
        if transform is None:
            raise UsageError(
                f"table {table}: sort order field {field.transform}({column.name}) cannot be "
                f"sorted by (compactor sorts by identity, year, month, day, hour, and truncate of "
                f"int, long, decimal, string and binary columns); "
                f"give sort_order",
                "sort_order",
            )
        fields.append(
            SortField(
                column.name,
                column.field_id,
                transform,
                field.direction == SortDirection.DESC,
                field.null_order == NullOrder.NULLS_FIRST,
            )
        )
    if not fields:  # every field void: a dropped column's leftover orders nothing
        raise UsageError(
            f"table {table}: its sort order orders by nothing (every field is void): give one "
            f'with sort_order (example: "{SORT_ORDER_EXAMPLE}")',
            "sort_order",
            "strategy",
        )
    return order, fields


def resolve_clustering(
    metadata: TableMetadata,
    table: str,
    strategy: str,
    sort_order: str | None,
    zorder: str | None,
) -> Clustering | None:
    """The clustering a run's options ask for on this table; None for bin-packing."""
    schema = metadata.schema()
    if strategy == "zorder":
        assert zorder is not None, "checked with the options"
        fields = tuple(
            SortField(c.name, c.field_id)
            for c in (_column(schema, table, name, "zorder") for name in parse_columns(zorder))
        )
        return Clustering("zorder", fields)
    if strategy != "sort":
        return None
    if sort_order is None:
        order, table_fields = _table_order(metadata, table)
        return Clustering("sort", tuple(table_fields), order.order_id)
    fields = tuple(
        SortField(column.name, column.field_id, "identity", descending, nulls_first)
        for column, descending, nulls_first in (
            (_column(schema, table, name, "sort_order"), descending, nulls_first)
            for name, descending, nulls_first in parse_sort_order(sort_order)
        )
    )
    return Clustering("sort", fields, _matching_order_id(metadata, fields))


def _matching_order_id(metadata: TableMetadata, fields: tuple[SortField, ...]) -> int | None:
    """The id of a table sort order that is exactly ``fields`` (identity transforms), if any."""
    for order in metadata.sort_orders:
        same = len(order.fields) == len(fields) and all(
            isinstance(o.transform, IdentityTransform)
            and o.source_id == f.field_id
            and (o.direction == SortDirection.DESC) == f.descending
            and (o.null_order == NullOrder.NULLS_FIRST) == f.nulls_first
            for o, f in zip(order.fields, fields, strict=True)
        )
        if same and not order.is_unsorted:
            return order.order_id
    return None
