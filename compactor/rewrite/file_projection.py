"""How a Parquet file's columns are read as the table's columns, worked out once per file schema.

Iceberg reads a column by its field id: the Parquet field id when the file has them, else the
id the table's name mapping (``schema.name-mapping.default``) gives the column's name, as
pyiceberg's :func:`~pyiceberg.io.pyarrow.pyarrow_to_schema` resolves it; the fields of structs,
lists and maps alike. A :class:`Projection` is the result for one file schema, in terms a bulk
scan can carry out: each column of the written schema is read from a column of the file
(renamed; widened by a type promotion of the spec: int to long, float to double, a decimal to
a larger precision), or, missing from the file, filled with its identity partition value
(Hive-style files), or null. Within a nested column the scan's cast matches a struct's fields
by name: the scan type carries the file's names (a field the file lacks under a name none of
its fields has, so the cast fills it with nulls), and :func:`fill` renames them afterwards.

Where the rules need more than that, there is no projection and the file goes through the
Iceberg read path: a name that maps to more than one field, two fields of one struct resolving
to one field id or sharing a name, a type change other than those promotions, a missing
required field (nested or not) without a partition value, a field with an initial default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa
from pyiceberg.io.pyarrow import pyarrow_to_schema
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import MappedField, NameMapping
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StructType

FIELD_ID = b"PARQUET:field_id"
_WIDTHS = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
# A field by its names from the top: a list's element is "element", a map's "key" and "value",
# as name mappings name them.
Path: TypeAlias = tuple[str, ...]


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


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _children(kind: pa.DataType) -> list[tuple[str, pa.Field]]:
    """The fields of a nested Arrow type, each with its name in a :data:`Path`."""
    if pa.types.is_struct(kind):
        return [(field.name, field) for field in kind.fields]
    if _is_list(kind):
        return [("element", kind.value_field)]
    if pa.types.is_map(kind):
        return [("key", kind.key_field), ("value", kind.item_field)]
    return []


def _arrow_paths(
    children: Iterable[tuple[str, pa.Field]], parent: Path = ()
) -> Iterator[tuple[Path, pa.Field]]:
    """Every field of ``children`` (named as :func:`_children` names them) and of their nested
    types, with its path."""
    for name, field in children:
        path = (*parent, name)
        yield path, field
        yield from _arrow_paths(_children(field.type), path)


def _iceberg_children(kind: IcebergType) -> list[NestedField]:
    if isinstance(kind, StructType):
        return list(kind.fields)
    if isinstance(kind, ListType):
        return [kind.element_field]
    if isinstance(kind, MapType):
        return [kind.key_field, kind.value_field]
    return []


def _iceberg_ids(fields: Iterable[NestedField], parent: Path = ()) -> Iterator[tuple[Path, int]]:
    """The field id of every field of ``fields`` and of their nested types, by path."""
    for field in fields:
        path = (*parent, field.name)
        yield path, field.field_id
        yield from _iceberg_ids(_iceberg_children(field.field_type), path)


def _mapped_paths(fields: Iterable[MappedField], parent: Path = ()) -> Iterator[Path]:
    """Every path a name mapping names, once for each field it names."""
    for field in fields:
        for name in field.names:
            yield (*parent, name)
            yield from _mapped_paths(field.fields, (*parent, name))


def _field_id(field: pa.Field) -> int:
    return int(field.metadata[FIELD_ID])


@dataclass(frozen=True)
class Projection:
    """Reading files of one schema as ``expected``.

    ``scan`` is the schema to scan them with: ``expected``'s fields and types under the file's
    names, nested ones included (a field the file lacks under a name none of its fields has,
    so the scan fills it with nulls). ``partition_columns`` pairs each missing top-level
    column's position with the position of its identity partition field.
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
    """Projections of file schemas onto ``expected`` (the written schema, field ids in the
    metadata of its fields, nested ones included), each worked out once; ``schema`` is the
    Iceberg schema ``expected`` was made from."""

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
        self._ids = [_field_id(f) for f in expected]
        self._mapped_paths = Counter(_mapped_paths(name_mapping or ()))
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

    def _file_ids(self, physical: pa.Schema) -> dict[Path, int] | None:
        """The field id of each field of ``physical``, nested ones included, by path; None
        where ambiguous."""
        try:
            file_schema = pyarrow_to_schema(
                physical,
                self._mapping,
                downcast_ns_timestamp_to_us=self._format_version <= 2,
                format_version=self._format_version,  # type: ignore[arg-type]
            )
        except Exception:  # the Iceberg read path raises it, naming the file
            return None
        paths = list(_arrow_paths((f.name, f) for f in physical))
        mapped = any(FIELD_ID not in (field.metadata or {}) for _, field in paths)
        if len({path for path, _ in paths}) < len(paths) or (  # a scan reads by name
            mapped and any(self._mapped_paths[path] > 1 for path, _ in paths)
        ):
            return None
        return dict(_iceberg_ids(file_schema.fields))

    def _resolve(self, physical: pa.Schema, spec: PartitionSpec | None) -> Projection | None:
        ids = self._file_ids(physical)
        if ids is None:
            return None
        column_of = _by_id(list(physical), (), ids)
        if column_of is None:
            return None
        identity = {
            f.source_id: position
            for position, f in enumerate(spec.fields if spec else ())
            if isinstance(f.transform, IdentityTransform)
        }
        fields, partition_columns = [], []
        for i, (wanted, field_id) in enumerate(zip(self._expected, self._ids, strict=True)):
            if field_id in column_of:
                found = column_of[field_id]
                kind = self._scan_type(found.type, wanted.type, (found.name,), ids)
                if kind is None:
                    return None
                fields.append(wanted.with_name(found.name).with_type(kind))
                continue
            if self._schema.find_field(field_id).initial_default is not None:
                return None
            if field_id in identity:
                partition_columns.append((i, identity[field_id]))
            elif not wanted.nullable:
                return None
            fields.append(wanted.with_name(_unused_name(wanted.name, field_id, physical.names)))
        return Projection(pa.schema(fields), tuple(partition_columns))

    def _scan_type(
        self, found: pa.DataType, wanted: pa.DataType, path: Path, ids: dict[Path, int]
    ) -> pa.DataType | None:
        """``wanted`` as a scan casts the file's ``found`` (at ``path``) to it, under the file's
        names; None if a cast cannot read it as Iceberg does."""
        if pa.types.is_struct(wanted) and pa.types.is_struct(found):
            return self._scan_struct(found, wanted, path, ids)
        if _is_list(wanted) and _is_list(found):
            element = self._scan_field(found.value_field, wanted.value_field, path, "element", ids)
            if element is None:
                return None
            return pa.large_list(element) if pa.types.is_large_list(wanted) else pa.list_(element)
        if pa.types.is_map(wanted) and pa.types.is_map(found):
            key = self._scan_field(found.key_field, wanted.key_field, path, "key", ids)
            item = self._scan_field(found.item_field, wanted.item_field, path, "value", ids)
            return None if key is None or item is None else pa.map_(key, item)
        if pa.types.is_nested(found) or pa.types.is_nested(wanted):
            return None
        return wanted if _same(found, wanted) or _promotes(found, wanted) else None

    def _scan_field(
        self, found: pa.Field, wanted: pa.Field, path: Path, name: str, ids: dict[Path, int]
    ) -> pa.Field | None:
        """The field of the scan type for ``wanted``, read from the file's ``found``."""
        path = (*path, name)
        if ids.get(path) != _field_id(wanted):
            return None
        kind = self._scan_type(found.type, wanted.type, path, ids)
        return None if kind is None else pa.field(found.name, kind, found.nullable, wanted.metadata)

    def _scan_struct(
        self, found: pa.StructType, wanted: pa.StructType, path: Path, ids: dict[Path, int]
    ) -> pa.StructType | None:
        """A struct's fields by field id under the file's names, the missing ones null."""
        children = _by_id(found.fields, path, ids)
        if children is None:
            return None
        names = [f.name for f in found.fields]
        fields = []
        for want in wanted.fields:
            field_id = _field_id(want)
            if field_id in children:
                child = children[field_id]
                field = self._scan_field(child, want, path, child.name, ids)
            elif want.nullable and self._schema.find_field(field_id).initial_default is None:
                field = want.with_name(_unused_name(want.name, field_id, names))
            else:
                field = None
            if field is None:
                return None
            fields.append(field)
        return pa.struct(fields)


def _by_id(
    fields: list[pa.Field], parent: Path, ids: dict[Path, int]
) -> dict[int, pa.Field] | None:
    """``fields`` (of the struct at ``parent``) by field id; None if two share one."""
    by_id: dict[int, pa.Field] = {}
    for field in fields:
        field_id = ids.get((*parent, field.name))
        if field_id is None or field_id in by_id:
            return None
        by_id[field_id] = field
    return by_id


def _unused_name(name: str, field_id: int, taken: list[str]) -> str:
    """A name for field ``field_id`` that no field of the file's struct has."""
    candidate = f"{name}#{field_id}"
    while candidate in taken:
        candidate += "#"
    return candidate


def fill(batch: pa.RecordBatch, constants: dict[int, Any], expected: pa.Schema) -> pa.RecordBatch:
    """``batch`` (scanned with a projection's schema) in ``expected``, with its constants, its
    nested fields under ``expected``'s names."""
    columns = [
        pa.repeat(constants[i], batch.num_rows) if i in constants else _renamed(column, field.type)
        for i, (column, field) in enumerate(zip(batch.columns, expected, strict=True))
    ]
    return pa.RecordBatch.from_arrays(columns, schema=expected)


def _renamed(column: pa.Array, kind: pa.DataType) -> pa.Array:
    """``column`` as ``kind``, a type of the same layout (names and nullability aside)."""
    return column if column.type == kind else column.view(kind)
