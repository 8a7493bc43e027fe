"""Manifest entries decoded without their column metrics, for planning.

pyiceberg decodes every field of every entry into Python objects, most of them the six
column-metric maps, and a planner holding them holds about 10 KB a file of a 23-column table.
:func:`planning_entries` reads the same entries with closures compiled once per manifest
schema over pyiceberg's compiled Avro decoder: every field of the entry and its data file,
except the metric maps (kept for the field ids asked for only) and ``split_offsets``, which
are skipped a block at a time (11 µs of CPU an entry of 23 columns, pyiceberg's reader 19 µs).
The entries are pyiceberg's own ``ManifestEntry`` and ``DataFile`` records, laid out as
:func:`~compactor.iceberg.pyiceberg_compat.manifest_entries` lays them out, with the same
inherited values; the skipped fields are None. :func:`read_in_order` reads many manifests a
few at a time.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from enum import Enum
from typing import Any, TypeVar

from pyiceberg.avro.decoder import BinaryDecoder
from pyiceberg.avro.resolver import construct_reader
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
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
    StringType,
    StructType,
    UnknownType,
    UUIDType,
)
from pyiceberg.utils.decimal import decimal_required_bytes
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from compactor.iceberg.interop import refuse_fixed_partitions
from compactor.iceberg.pyiceberg_compat import avro_blocks, with_inherited_values
from compactor.options.defaults import MANIFEST_READERS

__all__ = ["METRIC_FIELD_IDS", "planning_entries", "read_in_order"]

_DATA_FILE_ID = 2
_PARTITION_ID = 102
# column_sizes, value_counts, null_value_counts, nan_value_counts, lower_bounds, upper_bounds
METRIC_FIELD_IDS = frozenset({108, 109, 110, 137, 125, 128})
_SPLIT_OFFSETS_ID = 132
_ENUMS: dict[int, type[Enum]] = {0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}

T = TypeVar("T")
Read = Callable[[BinaryDecoder], Any]
Skip = Callable[[BinaryDecoder], None]


def read_in_order(
    read: Callable[[ManifestFile], T], manifests: Iterable[ManifestFile]
) -> Iterator[tuple[ManifestFile, T]]:
    """Each of ``manifests`` with what ``read`` makes of it, in order, MANIFEST_READERS read at
    a time and none further ahead of the caller: memory holds a few manifests' entries,
    never a whole table's."""
    with ThreadPoolExecutor(MANIFEST_READERS) as pool:
        pending: deque[tuple[ManifestFile, Future[T]]] = deque()
        for manifest in manifests:
            pending.append((manifest, pool.submit(read, manifest)))
            if len(pending) >= MANIFEST_READERS:
                done, future = pending.popleft()
                yield done, future.result()
        for done, future in pending:
            yield done, future.result()


def planning_entries(
    io: FileIO,
    manifest: ManifestFile,
    format_version: int,
    metric_ids: Collection[int] = (),
) -> list[ManifestEntry]:
    """The live entries of ``manifest``, as :func:`manifest_entries` reads them, without their
    column metrics but those of ``metric_ids`` and without ``split_offsets``."""
    with io.new_input(manifest.manifest_path).open() as stream:
        data = stream.read()
    schema, blocks = avro_blocks(data)
    read_version = 3 if format_version >= 3 else DEFAULT_READ_VERSION
    read_entry = _entry_reader(schema, read_version, frozenset(metric_ids), manifest.manifest_path)
    entries = [read_entry(decoder) for records, decoder in blocks for _ in range(records)]
    return with_inherited_values(entries, manifest)


# Readers compiled per (manifest schema, read version, metric ids); a table has a handful.
_CACHED_READERS = 64
_readers: dict[tuple[str, int, frozenset[int]], Read] = {}
_readers_lock = threading.Lock()


def _entry_reader(
    avro_schema: str, read_version: int, metric_ids: frozenset[int], location: str
) -> Read:
    """The reader of one entry of a manifest of ``avro_schema``, cached per distinct schema;
    ``location``, the manifest's, names it when its schema is refused."""
    key = (avro_schema, read_version, metric_ids)
    with _readers_lock:
        reader = _readers.get(key)
    if reader is None:
        schema = AvroSchemaConversion().avro_to_iceberg(json.loads(avro_schema))
        reader = _compile_entry(schema, read_version, metric_ids, location)
        with _readers_lock:
            if len(_readers) >= _CACHED_READERS:
                _readers.clear()
            _readers[key] = reader
    return reader


def _compile_entry(
    schema: Schema, read_version: int, metric_ids: frozenset[int], location: str
) -> Read:
    data_file_field = schema.find_field(_DATA_FILE_ID)
    file_data_file = data_file_field.field_type
    assert isinstance(file_data_file, StructType)
    partition = file_data_file.field(_PARTITION_ID)
    assert partition is not None and isinstance(partition.field_type, StructType)
    refuse_fixed_partitions(partition.field_type, f"manifest {location}")
    read_data_file = _struct_reader(
        file_data_file, DATA_FILE_TYPE[read_version], DataFile, metric_ids
    )
    return _struct_reader(
        schema.as_struct(),
        MANIFEST_ENTRY_SCHEMAS[read_version].as_struct(),
        ManifestEntry,
        metric_ids,
        {_DATA_FILE_ID: read_data_file},
    )


def _struct_reader(
    file_struct: StructType,
    read_struct: StructType,
    make: Callable[..., Any],
    metric_ids: frozenset[int],
    nested: dict[int, Read] | None = None,
) -> Read:
    """Reads a ``file_struct`` into ``make(*values)`` laid out as ``read_struct``.

    Fields the file lacks take the read field's initial default; metric maps are filtered to
    ``metric_ids`` (skipped when it is empty), ``split_offsets`` skipped.
    """
    positions = {f.field_id: pos for pos, f in enumerate(read_struct.fields)}
    defaults = [f.initial_default for f in read_struct.fields]
    discard = len(defaults)  # skipped fields "read" into one more slot, dropped
    steps: list[tuple[int, Read]] = []
    for field in file_struct.fields:
        pos = positions.get(field.field_id)
        wanted = field.field_id != _SPLIT_OFFSETS_ID and (
            field.field_id not in METRIC_FIELD_IDS or metric_ids
        )
        if pos is None or not wanted:
            steps.append((discard, _optional_skip(field)))
            continue
        read = (nested or {}).get(field.field_id) or _value_reader(field, metric_ids)
        steps.append((pos, _optional_read(field, read)))
    plan = tuple(steps)

    def read_struct_values(decoder: BinaryDecoder) -> Any:
        values = [*defaults, None]
        for pos, read in plan:
            values[pos] = read(decoder)
        del values[discard]
        return make(*values)

    return read_struct_values


def _value_reader(field: NestedField, metric_ids: frozenset[int]) -> Read:
    """pyiceberg's reader of the field's values (its enum, for enum fields)."""
    read = construct_reader(field.field_type).read
    enum = _ENUMS.get(field.field_id)
    if enum is not None:
        members = _EnumMembers(enum)
        return lambda decoder: members[read(decoder)]
    if field.field_id in METRIC_FIELD_IDS:
        return lambda decoder: {k: v for k, v in read(decoder).items() if k in metric_ids}
    return read


class _EnumMembers(dict[Any, Enum]):
    """An enum's members by the values read (looked up once per distinct value)."""

    def __init__(self, enum: type[Enum]) -> None:
        super().__init__()
        self._enum = enum

    def __missing__(self, value: Any) -> Enum:
        member = self[value] = self._enum(value)
        return member


def _optional_read(field: NestedField, read: Read) -> Read:
    if field.required:
        return read
    # Iceberg's Avro unions are [null, type]: branch 1 holds a value.
    return lambda decoder: read(decoder) if decoder.read_int() else None


def _optional_skip(field: NestedField) -> Skip:
    skip = _skipper(field.field_type)
    if field.required:
        return skip

    def skip_optional(decoder: BinaryDecoder) -> None:
        if decoder.read_int():
            skip(decoder)

    return skip_optional


def _skipper(kind: IcebergType) -> Skip:
    """Skips a value of ``kind``: metric maps and offset lists a block at a time."""
    if isinstance(kind, StructType):
        skips = [_optional_skip(f) for f in kind.fields]

        def skip_struct(decoder: BinaryDecoder) -> None:
            for skip in skips:
                skip(decoder)

        return skip_struct
    if isinstance(kind, ListType | MapType):
        return _block_skipper(kind)
    return _primitive_skipper(kind)


def _block_skipper(kind: ListType | MapType) -> Skip:
    """Skips an Avro array or map: by its byte size when the block has one, else its items
    (int and long items in one call, int-to-binary pairs in one call)."""
    if isinstance(kind, ListType):
        items = [NestedField(-1, "element", kind.element_type, kind.element_required)]
    else:
        items = [
            NestedField(-1, "key", kind.key_type, required=True),
            NestedField(-2, "value", kind.value_type, kind.value_required),
        ]
    types = [f.field_type for f in items if f.required]
    skip_item: Callable[[BinaryDecoder, int], None]
    if len(types) == len(items) and all(isinstance(t, IntegerType | LongType) for t in types):

        def skip_item(decoder: BinaryDecoder, count: int) -> None:
            decoder.read_ints(count * len(items))

    elif (
        len(types) == len(items) == 2
        and isinstance(types[0], IntegerType | LongType)
        and isinstance(types[1], BinaryType)
    ):
        scratch: dict[int, bytes] = {}

        def skip_item(decoder: BinaryDecoder, count: int) -> None:
            decoder.read_int_bytes_dict(count, scratch)
            scratch.clear()

    else:
        skips = [_optional_skip(f) for f in items]

        def skip_item(decoder: BinaryDecoder, count: int) -> None:
            for _ in range(count):
                for skip in skips:
                    skip(decoder)

    def skip_blocks(decoder: BinaryDecoder) -> None:
        count = decoder.read_int()
        while count:
            if count < 0:
                decoder.skip(decoder.read_int())
            else:
                skip_item(decoder, count)
            count = decoder.read_int()

    return skip_blocks


def _primitive_skipper(kind: IcebergType) -> Skip:
    if isinstance(kind, BooleanType):
        return lambda decoder: decoder.skip_boolean()
    if isinstance(kind, FloatType):
        return lambda decoder: decoder.skip_float()
    if isinstance(kind, DoubleType):
        return lambda decoder: decoder.skip_double()
    if isinstance(kind, StringType | BinaryType):
        return lambda decoder: decoder.skip_bytes()
    if isinstance(kind, DecimalType):  # a fixed of the precision's size
        size = decimal_required_bytes(kind.precision)
        return lambda decoder: decoder.skip(size)
    if isinstance(kind, UUIDType):
        return lambda decoder: decoder.skip(16)
    if isinstance(kind, FixedType):
        length = len(kind)
        return lambda decoder: decoder.skip(length)
    if isinstance(kind, UnknownType):
        return lambda decoder: None
    return lambda decoder: decoder.skip_int()  # ints, longs, dates, times, timestamps
