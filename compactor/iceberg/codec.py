"""One JSON form for Iceberg DataFiles, exact for every field: what tasks and results carry.

A DataFile becomes an object holding every field of the spec's ``data_file`` struct (of format
version 2, or 3 for files read from v3 manifests, with ``first_row_id`` and the deletion vector
fields), plus its ``spec_id``. Metrics maps become lists of
``[field id, value]`` pairs in their original order, bytes become base64, and the partition
tuple becomes ``[[type, base64 of the value's single-value serialisation], ...]``: each value
carries its Iceberg type, so a record decodes without the table's metadata and every type
(date, timestamp, decimal, uuid, fixed, ...) comes back as the same Python value.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter
from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.manifest import DATA_FILE_TYPE, DataFile, DataFileContent
from pyiceberg.manifest import FileFormat as IcebergFileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    IcebergType,
    ListType,
    MapType,
    PrimitiveType,
    UUIDType,
)

DATA_FILE_STRUCTS = {len(DATA_FILE_TYPE[v].fields): DATA_FILE_TYPE[v] for v in (2, 3)}
_TYPES: TypeAdapter[IcebergType] = TypeAdapter(IcebergType)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


PartitionTypes = Mapping[int, Sequence[IcebergType]]
"""The Iceberg type of each partition field, per partition spec id."""


def partition_types(spec: PartitionSpec, schema: Schema) -> tuple[IcebergType, ...]:
    """The types of ``spec``'s partition fields over ``schema``."""
    return tuple(f.field_type for f in spec.partition_type(schema).fields)


def encode_partition(partition: Record, types: Sequence[IcebergType]) -> list[list[str | None]]:
    """``[[type, base64 value or None], ...]`` for a partition tuple of the given field types."""
    if len(partition) != len(types):
        raise ValueError(f"partition {partition} does not have {len(types)} fields")
    encoded: list[list[str | None]] = []
    for position, field_type in enumerate(types):
        value = partition[position]
        if value is None:
            encoded.append([str(field_type), None])
            continue
        if not isinstance(field_type, PrimitiveType):
            raise ValueError(f"partition values are primitive, not {field_type}")
        encoded.append([str(field_type), _b64(to_bytes(field_type, value))])
    return encoded


def parse_type(name: str) -> IcebergType:
    """The Iceberg type ``str(type)`` names, e.g. ``decimal(9, 2)``."""
    return _TYPES.validate_python(name)


def decode_partition(encoded: list[list[str | None]]) -> Record:
    """The partition tuple :func:`encode_partition` encoded."""
    values: list[Any] = []
    for type_name, raw in encoded:
        field_type = parse_type(str(type_name))
        if raw is None:
            values.append(None)
            continue
        if not isinstance(field_type, PrimitiveType):
            raise ValueError(f"partition values are primitive, not {field_type}")
        value = from_bytes(field_type, _unb64(raw))
        if isinstance(field_type, UUIDType) and isinstance(value, bytes):
            value = uuid.UUID(bytes=value)  # as pyiceberg's Avro reader returns it
        values.append(value)
    return Record(*values)


def _encode(value: Any, field_type: IcebergType) -> Any:
    if value is None:
        return None
    if isinstance(field_type, MapType):
        return [[k, _encode(v, field_type.value_type)] for k, v in value.items()]
    if isinstance(field_type, ListType):
        return [_encode(v, field_type.element_type) for v in value]
    if isinstance(field_type, BinaryType):
        return _b64(value)
    return value


def _decode(value: Any, field_type: IcebergType) -> Any:
    if value is None:
        return None
    if isinstance(field_type, MapType):
        return {k: _decode(v, field_type.value_type) for k, v in value}
    if isinstance(field_type, ListType):
        return [_decode(v, field_type.element_type) for v in value]
    if isinstance(field_type, BinaryType):
        return _unb64(value)
    return value


def encode_data_file(data_file: DataFile, types: PartitionTypes) -> dict[str, Any]:
    """Every field of ``data_file`` as JSON-ready values; ``types`` must know its spec."""
    struct = DATA_FILE_STRUCTS.get(len(data_file))
    if struct is None:
        raise ValueError(
            f"{data_file.file_path}: a data file with {len(data_file)} fields, expected "
            f"one of {sorted(DATA_FILE_STRUCTS)} (format versions 2 and 3)"
        )
    fields = struct.fields
    encoded: dict[str, Any] = {}
    for position, field in enumerate(fields):
        value = data_file[position]
        if field.name == "content":
            encoded[field.name] = int(value)
        elif field.name == "file_format":
            encoded[field.name] = IcebergFileFormat(value).value
        elif field.name == "partition":
            encoded[field.name] = encode_partition(value, types[data_file.spec_id])
        else:
            encoded[field.name] = _encode(value, field.field_type)
    encoded["spec_id"] = data_file.spec_id
    return encoded


def decode_data_file(encoded: dict[str, Any]) -> DataFile:
    """The DataFile :func:`encode_data_file` encoded, equal in every field."""
    values: dict[str, Any] = {}
    struct = DATA_FILE_TYPE[3] if "first_row_id" in encoded else DATA_FILE_TYPE[2]
    for field in struct.fields:
        value = encoded[field.name]
        if field.name == "content":
            values[field.name] = DataFileContent(value)
        elif field.name == "file_format":
            values[field.name] = IcebergFileFormat(value)
        elif field.name == "partition":
            values[field.name] = decode_partition(value)
        else:
            values[field.name] = _decode(value, field.field_type)
    data_file = DataFile(*(values[f.name] for f in struct.fields))
    data_file.spec_id = encoded["spec_id"]
    return data_file
