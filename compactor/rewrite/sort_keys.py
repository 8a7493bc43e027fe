"""Sort keys: each row's place in a sort or z-order as one binary value, compared bytewise.

A sort key concatenates, per sort field, a null marker byte and the (transformed) value in an
order-preserving encoding: integers, dates, times and timestamps as big-endian 64-bit with the
sign flipped; floats by their IEEE bits, flipped so that -inf < ... < inf < NaN; decimals as
their 128-bit unscaled value; uuids in Iceberg Java's order (two signed longs: the first and
ninth bytes with their top bit flipped); fixed-width binary as it is; strings and binary with
0x00 escaped as 0x00 0xFF and ended by 0x00 0x00 (so no value is a prefix of another). A
descending field's value bytes are inverted. Byte order of the keys is then the order the
fields ask for, which lets any number of sorted runs be merged by comparing one column.

A z-order key interleaves the bits of each column's value mapped, order preserving, onto
``64 // columns`` bits: numbers, dates and times scaled between the group's smallest and
largest value (from the inputs' column bounds in the manifests, when every input has them),
strings and binary by their first bytes after the prefix all the group's values share, uuids
by the first bytes of their sort encoding. Nulls map to the smallest value and NaN to the
largest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.transforms import parse_transform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    FixedType,
    IcebergType,
    PrimitiveType,
    StringType,
    UUIDType,
)

from compactor.iceberg.pyiceberg_compat import arrow_storage, transform_arrow
from compactor.planning.sort_order import Clustering, SortField

_BYTES_TYPES = (StringType, BinaryType, FixedType, UUIDType)
_SIGN = np.uint64(1 << 63)


def _as_binary(matrix: np.ndarray) -> pa.Array:
    """Rows of an (n, width) uint8 matrix as a binary array."""
    rows, width = matrix.shape
    fixed = pa.Array.from_buffers(
        pa.binary(width), rows, [None, pa.py_buffer(np.ascontiguousarray(matrix).tobytes())]
    )
    return fixed.cast(pa.binary())


def _big_endian(values: np.ndarray) -> np.ndarray:
    """uint64 values as (n, 8) big-endian bytes."""
    return values.astype(">u8").view(np.uint8).reshape(-1, 8)


def _ordered_float_bits(numbers: np.ndarray) -> np.ndarray:
    """float64 -> uint64 whose unsigned order is the numbers' order (NaN after +inf)."""
    numbers = np.where(np.isnan(numbers), np.nan, numbers)  # one NaN: positive, quiet
    raw = np.ascontiguousarray(numbers, dtype=np.float64).view(np.uint64)
    negative = (raw & _SIGN).astype(bool)
    return np.where(negative, ~raw, raw | _SIGN)


def _integers(array: pa.Array) -> np.ndarray:
    if pa.types.is_boolean(array.type):
        array = pc.cast(array, pa.int8())
    elif pa.types.is_temporal(array.type):
        array = array.cast(pa.int64() if array.type.bit_width == 64 else pa.int32())
    return pc.cast(array, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)


def _invert(array: pa.Array) -> pa.Array:
    """A binary array with every byte of its values inverted."""
    array = pa.concat_arrays([array]) if array.offset else array
    _, offsets, data = array.buffers()
    if data is None:
        return array
    flipped = pa.py_buffer(np.bitwise_not(np.frombuffer(data, dtype=np.uint8)).tobytes())
    return pa.Array.from_buffers(pa.binary(), len(array), [None, offsets, flipped])


def _value_bytes(array: pa.Array) -> pa.Array:
    """Each value's order-preserving bytes (null values: arbitrary bytes)."""
    kind = array.type
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or (pa.types.is_large_binary(kind))
    ):
        binary = pc.fill_null(array.cast(pa.binary()), b"")
        escaped = pc.replace_substring(binary, pattern=b"\x00", replacement=b"\x00\xff")
        return pc.binary_join_element_wise(escaped, pa.scalar(b"\x00\x00"), pa.scalar(b""))
    if pa.types.is_fixed_size_binary(kind):
        filled = pc.fill_null(array, pa.scalar(b"\x00" * kind.byte_width, kind))
        return filled.cast(pa.binary())
    if pa.types.is_floating(kind):
        numbers = pc.cast(array, pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        return _as_binary(_big_endian(_ordered_float_bits(numbers)))
    if pa.types.is_decimal(kind):
        unscaled = pc.fill_null(array, pa.scalar(0, kind)).cast(pa.decimal128(38, kind.scale))
        unscaled = pa.concat_arrays([unscaled]) if unscaled.offset else unscaled
        words = np.frombuffer(unscaled.buffers()[1], dtype="<u8")[: 2 * len(unscaled)]
        low, high = words[0::2], words[1::2]
        return _as_binary(np.hstack([_big_endian(high ^ _SIGN), _big_endian(low)]))
    return _as_binary(_big_endian(_integers(array).view(np.uint64) ^ _SIGN))


def _uuid_bytes(array: pa.Array) -> np.ndarray:
    """uuids (as their 16 bytes) as an (n, 16) uint8 matrix whose unsigned order is Iceberg
    Java's: ``java.util.UUID`` compares its halves as signed longs, most significant first."""
    array = pa.concat_arrays([array]) if array.offset else array
    data = np.frombuffer(array.buffers()[1], dtype=np.uint8)[: 16 * len(array)]
    matrix = data.reshape(-1, 16).copy()
    matrix[:, [0, 8]] ^= 0x80
    return matrix


def _field_key(array: pa.Array, field: SortField, source_type: IcebergType) -> pa.Array:
    transform = parse_transform(field.transform)
    array = transform_arrow(transform, source_type, array)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(transform.result_type(source_type), UUIDType):
        value = _as_binary(_uuid_bytes(array))
    else:
        value = _value_bytes(array)
    if field.descending:
        value = _invert(value)
    nulls = np.asarray(array.is_null(), dtype=bool)
    marker = np.where(nulls, 0 if field.nulls_first else 2, 1).astype(np.uint8)
    return pc.binary_join_element_wise(_as_binary(marker[:, None]), value, pa.scalar(b""))


@dataclass(frozen=True)
class _ZColumn:
    """How one z-order column's values map onto ``bits`` bits."""

    position: int
    iceberg_type: IcebergType
    bits: int
    low: Any = None  # the group's bounds, when every input has them
    high: Any = None

    def values(self, array: pa.Array) -> np.ndarray:
        """Each value's ``bits``-bit code, order preserving; nulls 0."""
        array = arrow_storage(array)
        if isinstance(self.iceberg_type, _BYTES_TYPES):
            codes = self._byte_codes(array)
        else:
            codes = self._number_codes(array)
        if array.null_count:
            codes[np.asarray(array.is_null(), dtype=bool)] = 0
        return codes

    def _number_codes(self, array: pa.Array) -> np.ndarray:
        top = float(2**self.bits - 1)
        if isinstance(self.iceberg_type, BooleanType):
            array = pc.cast(array, pa.int8())
        elif pa.types.is_temporal(array.type):
            array = array.cast(pa.int64() if array.type.bit_width == 64 else pa.int32())
        # Longs beyond 2**53 round to the nearest double: still in order.
        numbers = pc.cast(array, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        numbers = np.nan_to_num(numbers, nan=np.inf, posinf=np.inf, neginf=-np.inf)
        low, high = _as_float(self.low), _as_float(self.high)
        if low is not None and high is not None and high > low:
            scaled = np.floor((np.clip(numbers, low, high) - low) / (high - low) * top)
            return np.nan_to_num(scaled, nan=0.0).astype(np.uint64)
        if low is not None and high is not None:  # one value in the whole group
            return np.zeros(len(numbers), dtype=np.uint64)
        # No finite bounds: the float's bits, flipped so that unsigned order is numeric order.
        return _ordered_float_bits(numbers) >> np.uint64(64 - self.bits)

    def _byte_codes(self, array: pa.Array) -> np.ndarray:
        prefix = _common_prefix(self.low, self.high)
        if isinstance(self.iceberg_type, UUIDType):  # bits flipped in place: same prefix length
            binary = _as_binary(_uuid_bytes(array))
        else:
            binary = array.cast(pa.binary()) if not pa.types.is_binary(array.type) else array
        if prefix:  # (pyarrow 23's binary_slice fails on 10+ values when given no stop)
            binary = pc.binary_slice(binary, len(prefix), len(prefix) + 8)
        binary = pa.concat_arrays([binary]) if binary.offset else binary
        offsets = np.frombuffer(binary.buffers()[1], dtype=np.int32)[: len(binary) + 1]
        data_buffer = binary.buffers()[2]
        data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer else np.zeros(0, np.uint8)
        starts, lengths = offsets[:-1], np.diff(offsets)
        code = np.zeros(len(binary), dtype=np.uint64)
        for i in range(8):
            present = lengths > i
            byte = np.zeros(len(binary), dtype=np.uint64)
            byte[present] = data[starts[present] + i]
            code |= byte << np.uint64(56 - 8 * i)
        return code >> np.uint64(64 - self.bits)


def _as_float(value: Any) -> float | None:
    """A bound as a float; None when it cannot scale values (not a number, or infinite)."""
    if value is None or isinstance(value, bytes | str):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _as_bytes(value: Any) -> bytes | None:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    return None


def _common_prefix(low: Any, high: Any) -> bytes:
    low, high = _as_bytes(low), _as_bytes(high)
    if low is None or high is None:
        return b""
    length = 0
    for a, b in zip(low, high, strict=False):
        if a != b:
            break
        length += 1
    return low[:length]


def _group_bounds(inputs: Sequence[DataFile], field_id: int, kind: IcebergType) -> tuple[Any, Any]:
    """The smallest lower and largest upper bound of a column over ``inputs``, if all have them.

    String bounds in manifests may be truncated prefixes: the lower one is still a lower bound;
    only the prefix they share is used.
    """
    if not isinstance(kind, PrimitiveType):
        return None, None  # only primitive columns have bounds
    lows: list[Any] = []
    highs: list[Any] = []
    for f in inputs:
        low, high = (f.lower_bounds or {}).get(field_id), (f.upper_bounds or {}).get(field_id)
        if low is None or high is None:
            return None, None
        lows.append(from_bytes(kind, low))
        highs.append(from_bytes(kind, high))
    if not lows:
        return None, None
    return min(lows), max(highs)


def interleave(codes: Sequence[np.ndarray], bits: int) -> np.ndarray:
    """Morton code: bit ``j`` (from the top) of column ``i`` goes to bit ``j * len(codes) + i``."""
    count = len(codes)
    z = np.zeros(len(codes[0]) if codes else 0, dtype=np.uint64)
    for j in range(bits):
        for i, code in enumerate(codes):
            bit = (code >> np.uint64(bits - 1 - j)) & np.uint64(1)
            z |= bit << np.uint64(63 - (j * count + i))
    return z


class SortKeys:
    """Computes the binary sort key of a batch's rows: ``prefix`` fields first (an output
    spec's partition fields), then ``clustering`` (its fields, or its z-order key).

    ``positions`` maps field ids to column positions in the batches; ``inputs`` are the group's
    data files (their column bounds scale z-order values).
    """

    def __init__(
        self,
        clustering: Clustering | None,
        schema: Schema,
        positions: dict[int, int],
        inputs: Sequence[DataFile],
        prefix: Sequence[SortField] = (),
    ) -> None:
        def located(fields: Sequence[SortField]) -> list[tuple[SortField, int, IcebergType]]:
            return [(f, positions[f.field_id], schema.find_type(f.field_id)) for f in fields]

        zorder = clustering is not None and clustering.strategy == "zorder"
        ordered = list(prefix) + list(clustering.fields if clustering and not zorder else ())
        self._fields = located(ordered)
        self._z: list[_ZColumn] = []
        if clustering is not None and zorder:
            bits = 64 // len(clustering.fields)
            self._z = [
                _ZColumn(position, kind, bits, *_group_bounds(inputs, f.field_id, kind))
                for f, position, kind in located(clustering.fields)
            ]

    def of(self, batch: pa.RecordBatch) -> pa.Array:
        """One binary key per row of ``batch``."""
        keys = [_field_key(batch.column(position), f, kind) for f, position, kind in self._fields]
        if self._z:
            codes = [z.values(batch.column(z.position)) for z in self._z]
            keys.append(_as_binary(_big_endian(interleave(codes, self._z[0].bits))))
        if len(keys) == 1:
            return keys[0]
        return pc.binary_join_element_wise(*keys, pa.scalar(b""))
