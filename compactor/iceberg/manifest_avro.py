"""Manifest files written by an Avro encoder compiled from the manifest's schema.

pyiceberg's own writer dispatches every value through generic writer objects, one bytes object
per encoded byte, and compresses each entry as an Avro block of its own. :class:`ManifestEncoder`
writes the same file (pyiceberg's header: its ``avro.schema`` and the writer's metadata; the
entries encoded to the same bytes) many entries to a block, with one closure per schema field,
varints computed once per value, and the stat maps' key/value pairs written in one loop.
(fastavro is slower here: it takes each map entry as a dict, and manifests are mostly maps.)
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, ItemsView, Mapping, Sequence
from itertools import chain
from typing import Any
from uuid import UUID

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO, KNOWN_CODECS
from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    ManifestEntry,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
)
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.typedef import Record
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
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)
from pyiceberg.utils.decimal import decimal_required_bytes, decimal_to_bytes
from pyiceberg.utils.lazydict import LazyDict
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

__all__ = ["ManifestEncoder"]

_MAGIC = b"Obj\x01"
_SYNC_SIZE = 16
# Encoded entries after which a block is closed (Avro Java's default sync interval).
_BLOCK_BYTES = 64_000
_NULL = b"\x00"  # union branch 0; also an empty array or map, and an array's or map's end
_NON_NULL = b"\x02"  # union branch 1
_DATA_FILE_ID = 2
_PARTITION_ID = 102
_INT_TYPES = (IntegerType, LongType)
# Types written as varints: ints, longs, and dates, times and timestamps as ints or longs.
_VARINT_TYPES = (
    *_INT_TYPES,
    DateType,
    TimeType,
    TimestampType,
    TimestamptzType,
    TimestampNanoType,
    TimestamptzNanoType,
)
_FLOAT = struct.Struct("<f").pack
_DOUBLE = struct.Struct("<d").pack

Write = Callable[[list[bytes], Any], None]


class _Varints(dict[int, bytes]):
    """Avro's zig-zag varint encoding of ints and longs, computed once per value."""

    def __missing__(self, value: int) -> bytes:
        n = (value << 1) ^ (value >> 63)
        out = bytearray()
        while n & ~0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        encoded = self[value] = bytes(out)
        return encoded


class ManifestEncoder:
    """A manifest whose Avro schema is ``schema``, encoded an entry at a time: what it holds is
    the encoded (and, by blocks, compressed) bytes, not the entries.

    ``metadata`` is the manifest writer's header metadata (``avro.codec`` in Iceberg's naming).
    Entries are laid out as pyiceberg's: v2 entries, with v3 data files for a v3 manifest.
    """

    def __init__(self, schema: Schema, metadata: Mapping[str, str]) -> None:
        codec_name = metadata.get(AVRO_CODEC_KEY, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
        codec_name = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec_name, codec_name)
        if codec_name not in KNOWN_CODECS:
            raise ValueError(f"Unsupported codec: {codec_name}")
        self._codec = KNOWN_CODECS[codec_name]
        avro_schema = AvroSchemaConversion().iceberg_to_avro(schema, schema_name="manifest_entry")
        self._varint = varint = _Varints()
        self._write_entry = _struct_writer(schema.as_struct(), _record_struct(schema), varint)
        self._sync = os.urandom(_SYNC_SIZE)
        meta = {**metadata, "avro.schema": json.dumps(avro_schema), AVRO_CODEC_KEY: codec_name}
        self._out = out = [_MAGIC, varint[len(meta)]]
        for key, value in meta.items():
            _write_bytes(out, key.encode(), varint)
            _write_bytes(out, value.encode(), varint)
        out += [_NULL, self._sync]
        self._block: list[bytes] = []
        self._size = 0

    def add(self, entry: ManifestEntry) -> None:
        parts: list[bytes] = []
        self._write_entry(parts, entry)
        encoded = b"".join(parts)
        self._block.append(encoded)
        self._size += len(encoded)
        if self._size >= _BLOCK_BYTES:
            self._close_block()

    def _close_block(self) -> None:
        data = b"".join(self._block)
        if self._codec is not None:
            data, _ = self._codec.compress(data)
        self._out.append(self._varint[len(self._block)])
        _write_bytes(self._out, data, self._varint)
        self._out.append(self._sync)
        self._block, self._size = [], 0

    def write(self, output_file: OutputFile) -> None:
        """Write the manifest to ``output_file``."""
        if self._block:
            self._close_block()
        with output_file.create(overwrite=True) as stream:
            stream.write(b"".join(self._out))


def _record_struct(schema: Schema) -> StructType:
    """How pyiceberg lays out the entries of a manifest of ``schema``.

    As v2 entries whose data files have v3's fields (v2's are their first fields).
    """
    data_file = schema.find_field(_DATA_FILE_ID).field_type
    assert isinstance(data_file, StructType)
    partition = data_file.field(_PARTITION_ID)
    assert partition is not None and isinstance(partition.field_type, StructType)
    data_file = data_file_with_partition(partition.field_type, format_version=3)
    return manifest_entry_schema_with_data_file(3, data_file).as_struct()


def _write_bytes(parts: list[bytes], value: bytes, varint: _Varints) -> None:
    parts.append(varint[len(value)])
    parts.append(value)


def _struct_writer(file_struct: StructType, record_struct: StructType, varint: _Varints) -> Write:
    """Writes records laid out as ``record_struct`` as ``file_struct``, fields matched by id.

    A field the record does not have is written as its write default, else null.
    """
    positions = {f.field_id: pos for pos, f in enumerate(record_struct.fields)}
    fields: list[tuple[int | None, Any, Write]] = []
    for field in file_struct.fields:
        pos = positions.get(field.field_id)
        if pos is None and field.required and field.write_default is None:
            raise ValueError(f"Field is required, and there is no write default: {field}")
        record_type = None if pos is None else record_struct.fields[pos].field_type
        fields.append((pos, field.write_default, _field_writer(field, record_type, varint)))

    def write_struct(parts: list[bytes], record: Record) -> None:
        for pos, default, write in fields:
            write(parts, default if pos is None else record[pos])

    return write_struct


def _field_writer(field: NestedField, record_type: IcebergType | None, varint: _Varints) -> Write:
    write = _writer(field.field_type, record_type, varint)
    if field.required:
        return write

    def write_optional(parts: list[bytes], value: Any) -> None:
        if value is None:
            parts.append(_NULL)
        else:
            parts.append(_NON_NULL)
            write(parts, value)

    return write_optional


def _writer(file_type: IcebergType, record_type: IcebergType | None, varint: _Varints) -> Write:
    """The writer of values of ``file_type`` (Avro's encoding of Iceberg's types)."""
    if isinstance(file_type, StructType):
        assert isinstance(record_type, StructType)
        return _struct_writer(file_type, record_type, varint)
    if isinstance(file_type, MapType):
        return _map_writer(file_type, varint)
    if isinstance(file_type, ListType):
        return _list_writer(file_type, varint)
    assert isinstance(file_type, PrimitiveType)
    return _primitive_writer(file_type, varint)


def _map_writer(map_type: MapType, varint: _Varints) -> Write:
    """A manifest's stat maps: int keys, long or binary values.

    Iceberg writes maps with non-string keys as arrays of key/value records; pyiceberg writes
    each in one Avro array block.
    """
    key, value = map_type.key_type, map_type.value_type
    if not isinstance(key, _INT_TYPES) or not map_type.value_required:
        raise ValueError(f"a manifest map of {map_type} is not supported")
    ints = varint.__getitem__

    if isinstance(value, _INT_TYPES):

        def write_longs(parts: list[bytes], values: Mapping[int, int]) -> None:
            if values:
                items = _items(values)
                parts.append(varint[len(items)])
                parts += map(ints, chain.from_iterable(items))
            parts.append(_NULL)

        return write_longs
    if isinstance(value, BinaryType):

        def write_binaries(parts: list[bytes], values: Mapping[int, bytes]) -> None:
            if values:
                items = _items(values)
                parts.append(varint[len(items)])
                for k, v in items:
                    parts += (varint[k], varint[len(v)], v)
            parts.append(_NULL)

        return write_binaries
    raise ValueError(f"a manifest map of {map_type} is not supported")


def _items(values: Mapping[Any, Any]) -> ItemsView[Any, Any]:
    # pyiceberg reads int/long maps as LazyDicts, whose own dict is the fast way in.
    return (values.__dict__() if isinstance(values, LazyDict) else values).items()


def _list_writer(list_type: ListType, varint: _Varints) -> Write:
    """A manifest's lists (``split_offsets``, ``equality_ids``): ints or longs, in one block."""
    if not isinstance(list_type.element_type, _INT_TYPES) or not list_type.element_required:
        raise ValueError(f"a manifest list of {list_type} is not supported")
    ints = varint.__getitem__

    def write_list(parts: list[bytes], values: Sequence[int]) -> None:
        if values:
            parts.append(varint[len(values)])
            parts += map(ints, values)
        parts.append(_NULL)

    return write_list


def _primitive_writer(primitive: PrimitiveType, varint: _Varints) -> Write:
    """Values as pyiceberg's writers take them: ints for dates and times, bytes or UUIDs."""
    if isinstance(primitive, BooleanType):
        return lambda parts, value: parts.append(b"\x01" if value else b"\x00")
    if isinstance(primitive, FloatType):
        return lambda parts, value: parts.append(_FLOAT(value))
    if isinstance(primitive, DoubleType):
        return lambda parts, value: parts.append(_DOUBLE(value))
    if isinstance(primitive, StringType):
        return lambda parts, value: _write_bytes(parts, value.encode(), varint)
    if isinstance(primitive, BinaryType):
        return lambda parts, value: _write_bytes(parts, value, varint)
    if isinstance(primitive, UUIDType):
        return lambda parts, value: parts.append(value.bytes if isinstance(value, UUID) else value)
    if isinstance(primitive, FixedType):
        return _fixed_writer(len(primitive))
    if isinstance(primitive, DecimalType):
        size = decimal_required_bytes(primitive.precision)
        return lambda parts, value: parts.append(decimal_to_bytes(value, byte_length=size))
    if isinstance(primitive, UnknownType):
        return lambda parts, value: None
    if isinstance(primitive, _VARINT_TYPES):
        return lambda parts, value: parts.append(varint[value])
    raise ValueError(f"a manifest value of type {primitive} is not supported")


def _fixed_writer(length: int) -> Write:
    def write_fixed(parts: list[bytes], value: bytes) -> None:
        if len(value) != length:
            raise ValueError(f"Expected {length} bytes, got {len(value)}")
        parts.append(value)

    return write_fixed
