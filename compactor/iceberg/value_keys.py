"""Values compared as the Iceberg spec and Iceberg Java compare them: by canonical serialisation.

Java compares floating-point values by ``Double.doubleToLongBits`` / ``Float.floatToIntBits``
(``Double.compare``): every NaN is one value whatever its payload, and -0.0 and 0.0 are two.
Python's ``==``, pyiceberg's ``Record`` equality (``Record(nan) != Record(nan)``,
``Record(-0.0) == Record(0.0)``) and Arrow's IEEE comparisons (``pc.not_equal``, hash joins on
float columns) say otherwise. Partition tuples and equality-delete keys are therefore compared
through the keys made here: :func:`partition_key` for partition records, :func:`canonical_array`
for Arrow columns. :func:`partition_sort_key` orders partition tuples as Java orders them (nulls
first, -0.0 before 0.0, NaN last), for writing manifests clustered by partition.
"""

from __future__ import annotations

import math
import struct
import uuid
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.typedef import Record

# What Java's Double.doubleToLongBits and Float.floatToIntBits give for every NaN.
CANONICAL_NAN_BITS_64 = 0x7FF8000000000000
CANONICAL_NAN_BITS_32 = 0x7FC00000

PartitionKey = tuple[Hashable, ...]
"""A partition tuple as a hashable key: equal exactly when Java holds the tuples equal."""


@dataclass(frozen=True, slots=True)
class FloatBits:
    """A float's canonical 64-bit pattern: never equal to a value of another type."""

    bits: int


def float_bits(value: float) -> int:
    """``value``'s IEEE 754 double bits, as ``Double.doubleToLongBits`` gives them.

    Every NaN maps to :data:`CANONICAL_NAN_BITS_64`; -0.0 and 0.0 keep their own patterns. A
    float32 value held as a Python float widens exactly, so its key is as distinct as its bits.
    """
    if math.isnan(value):
        return CANONICAL_NAN_BITS_64
    return struct.unpack("<q", struct.pack("<d", value))[0]


def value_key(value: Any) -> Hashable:
    """A hashable key of one partition value: floats by :func:`float_bits`, uuids by their
    bytes, records field by field, every other value (None included) as it is."""
    if isinstance(value, float):
        return FloatBits(float_bits(value))
    if isinstance(value, uuid.UUID):  # pyiceberg reads uuids so, and writes their 16 bytes
        return value.bytes
    if isinstance(value, Record):
        return partition_key(value)
    return value


def partition_key(partition: Record | None) -> PartitionKey:
    """The key of a partition tuple (None and the empty tuple, unpartitioned, are one key)."""
    if partition is None:
        return ()
    return tuple(value_key(partition[i]) for i in range(len(partition)))


def same_partition(a: Record | None, b: Record | None) -> bool:
    """Whether two partition tuples are one partition (every NaN equal, -0.0 not 0.0)."""
    return partition_key(a) == partition_key(b)


_BITS = {32: (pa.int32(), CANONICAL_NAN_BITS_32), 64: (pa.int64(), CANONICAL_NAN_BITS_64)}


def canonical_array(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``array`` with float32 and float64 values as their canonical bits (int32, int64).

    Each NaN becomes the canonical NaN pattern, -0.0 and 0.0 stay apart and nulls stay null, so
    Arrow's equality, joins and grouping on the result compare as Java does. Other types are
    returned as they are.
    """
    kind = array.type
    if not (pa.types.is_float32(kind) or pa.types.is_float64(kind)):
        return array
    width, nan = _BITS[kind.bit_width]
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([canonical_array(chunk) for chunk in array.chunks], width)
    return pc.if_else(pc.is_nan(array), pa.scalar(nan, width), array.view(width))


def value_sort_key(value: Any) -> tuple[Any, ...]:
    """A sort key of one partition value, ordered as Java orders them: null first, floats by
    ``Double.compare`` (-0.0 before 0.0, every NaN last and equal), uuids by their bytes.

    Keys of values of different types never compare their values (the type ranks first).
    """
    if value is None:
        return (0,)
    if isinstance(value, float):
        if math.isnan(value):
            return (1, 0, 1)
        return (1, 0, 0, value, not math.copysign(1.0, value) < 0)
    if isinstance(value, uuid.UUID):
        return (1, 1, value.bytes)
    if isinstance(value, Record):
        return (1, 2, partition_sort_key(value))
    if isinstance(value, bool):
        return (1, 3, value)
    if isinstance(value, bytes | bytearray):
        return (1, 4, bytes(value))
    if isinstance(value, str):
        return (1, 5, value)
    return (1, 6, type(value).__name__, value)


def partition_sort_key(partition: Record | None) -> tuple[tuple[Any, ...], ...]:
    """A sort key of a partition tuple: field by field, as :func:`value_sort_key`."""
    if partition is None:
        return ()
    return tuple(value_sort_key(partition[i]) for i in range(len(partition)))
