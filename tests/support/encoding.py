"""Variable-length and zigzag integers, as Avro and Thrift's compact protocol write them."""

from __future__ import annotations


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned variable-length integer at ``pos`` (Avro, Thrift's compact protocol) and
    the position after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def unzigzag(value: int) -> int:
    """A zigzag-encoded integer's value (Avro's int and long, Thrift's compact integers)."""
    return (value >> 1) ^ -(value & 1)
