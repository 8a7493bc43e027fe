"""How a Parquet file's columns are read as the table's columns, worked out once per file schema.

Iceberg reads a column by its field id: the Parquet field id when the file has them, else the
id the table's name mapping (``schema.name-mapping.default``) gives the column's name, as
pyiceberg's :func:`~pyiceberg.io.pyarrow.pyarrow_to_schema` resolves it. A :class:`Projection`
is the result for one file schema, in terms a bulk scan can carry out: each column of the
written schema is read from a column of the file (renamed; widened by a type promotion of the
spec: int to long, float to double, a decimal to a larger precision), or, missing from the
file, filled with its identity partition value (Hive-style files), or null.

Where the rules need more than that, there is no projection and the file goes through the
Iceberg read path: a name that maps to more than one field, two columns resolving to one field
id or sharing a name, a type change other than those promotions, a missing required column
without a partition value, a column with an initial default.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import pyarrow_to_schema
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import NameMapping
from pyiceberg.transforms import IdentityTransform

FIELD_ID = b"PARQUET:field_id"
_WIDTHS = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}


def _same(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Equal types, string and binary in either width."""
    return _WIDTHS.get(found, found) == _WIDTHS.get(wanted, wanted)


def _promotes(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether Iceberg reads ``found`` as ``wanted`` by widening: the cast a scan applies."""
    if pa.types.is_signed_integer(found) and pa.types.is_signed_integer(wanted):
        return found.bit_width < wanted.bit_width
    if pa.types.is_floating(found) and pa.types.is_floating(wanted):
        return found.bit_width < wanted.bit_width
    if pa.types.is_decimal(found) and pa.types.is_decimal(wanted):
        return found.scale == wanted.scale and found.precision <= wanted.precision
    return False


@dataclass(frozen=True)
class Projection:
    """Reading files of one schema as ``expected``.

    ``scan`` is the schema to scan them with: ``expected``'s fields and types under the file's
    column names (a column the file lacks under a name none of its columns has, so the scan
    fills it with nulls). ``partition_columns`` pairs each such missing column's position
    with the position of its identity partition field.
    """

    scan: pa.Schema
    partition_columns: tuple[tuple[int, int], ...]

    def constants(self, data_file: DataFile, expected: pa.Schema) -> dict[int, pa.Scalar] | None:
        """``data_file``'s partition values for the missing columns (a null value fills with
        nulls); None if a required column would be null."""
        values: dict[int, pa.Scalar] = {}
        for column, position in self.partition_columns:
            field = expected.field(column)
            value = data_file.partition[position]
            if value is None:
                if not field.nullable:
                    return None
                continue
            try:
                values[column] = pa.scalar(value, type=field.type)
            except (pa.ArrowException, TypeError, ValueError):
                return None
        return values


class Resolver:
    """Projections of file schemas onto ``expected`` (the written schema, field ids in its field
    metadata), each worked out once; ``schema`` is the table's current schema."""

    def __init__(
        self,
        expected: pa.Schema,
        schema: Schema,
        specs: dict[int, PartitionSpec],
        name_mapping: NameMapping | None,
        format_version: int,
    ) -> None:
        self._expected, self._schema, self._specs = expected, schema, specs
        self._mapping, self._format_version = name_mapping, format_version
        self._ids = [int(f.metadata[FIELD_ID]) for f in expected]
        self._mapped_names = Counter(name for field in name_mapping or () for name in field.names)
        self._known: dict[tuple[str, int], Projection | None] = {}

    def resolved(self) -> int:
        """File schemas resolved so far."""
        return len(self._known)

    def projection(self, physical: pa.Schema, spec_id: int) -> Projection | None:
        """How files of schema ``physical`` and spec ``spec_id`` are read; None if they need
        the Iceberg read path."""
        key = (physical.to_string(show_field_metadata=True, show_schema_metadata=False), spec_id)
        if key not in self._known:
            self._known[key] = self._resolve(physical, self._specs.get(spec_id))
        return self._known[key]

    def _file_ids(self, physical: pa.Schema) -> list[int] | None:
        """The field id of each top-level column of ``physical``; None where ambiguous."""
        try:
            file_schema = pyarrow_to_schema(
                physical,
                self._mapping,
                downcast_ns_timestamp_to_us=self._format_version <= 2,
                format_version=self._format_version,  # type: ignore[arg-type]
            )
        except Exception:  # the Iceberg read path raises it, naming the file
            return None
        ids = [f.field_id for f in file_schema.fields]
        mapped = any(FIELD_ID not in (f.metadata or {}) for f in physical)
        if (
            len(set(ids)) < len(ids)
            or len(set(physical.names)) < len(physical.names)  # a scan reads by name
            or (mapped and any(self._mapped_names[name] > 1 for name in physical.names))
        ):
            return None
        return ids

    def _resolve(self, physical: pa.Schema, spec: PartitionSpec | None) -> Projection | None:
        ids = self._file_ids(physical)
        if ids is None:
            return None
        column_of = {field_id: i for i, field_id in enumerate(ids)}
        identity = {
            f.source_id: position
            for position, f in enumerate(spec.fields if spec else ())
            if isinstance(f.transform, IdentityTransform)
        }
        fields, partition_columns = [], []
        for i, (wanted, field_id) in enumerate(zip(self._expected, self._ids, strict=True)):
            if field_id in column_of:
                found = physical.field(column_of[field_id])
                if not (_same(found.type, wanted.type) or _promotes(found.type, wanted.type)):
                    return None
                fields.append(wanted.with_name(found.name))
                continue
            table_field = self._schema.find_field(field_id)
            if table_field.initial_default is not None:
                return None
            if field_id in identity:
                partition_columns.append((i, identity[field_id]))
            elif table_field.required:
                return None
            fields.append(wanted.with_name(_unused_name(wanted.name, field_id, physical.names)))
        return Projection(pa.schema(fields), tuple(partition_columns))


def _unused_name(name: str, field_id: int, taken: list[str]) -> str:
    """A column name for field ``field_id`` that no column of the file has."""
    candidate = f"{name}#{field_id}"
    while candidate in taken:
        candidate += "#"
    return candidate


def fill(batch: pa.RecordBatch, constants: dict[int, Any], expected: pa.Schema) -> pa.RecordBatch:
    """``batch`` (scanned with a projection's schema) in ``expected``, with its constants."""
    columns = [
        pa.repeat(constants[i], batch.num_rows) if i in constants else column
        for i, column in enumerate(batch.columns)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=expected)
