"""Where Iceberg writers disagree on bytes, and what compactor refuses because of it.

Iceberg Java (through 1.11 at least) writes the ``fixed`` values of a manifest's partition
tuple with a length prefix, which the Avro spec, pyiceberg and compactor do not write
(apache/iceberg#17501). A manifest of a partition on a ``fixed`` column therefore cannot be read
right without knowing which writer wrote it, and Java cannot read one compactor writes. Rather
than misread one (and plan, commit or delete from a wrong reading), compactor refuses such
tables, naming the partition field.
"""

from __future__ import annotations

from pyiceberg.types import FixedType, StructType

from compactor.errors import UnsupportedTableError


def refuse_fixed_partitions(partition_type: StructType, where: str) -> None:
    """Raise :class:`UnsupportedTableError` when a partition field of ``partition_type`` (the
    partition tuple of a manifest or a spec, described by ``where``) is ``fixed``."""
    for field in partition_type.fields:
        if isinstance(field.field_type, FixedType):
            raise UnsupportedTableError(
                f"{where}: partition field {field.name!r} is {field.field_type}, whose manifest "
                "values Iceberg Java writes with a length prefix other writers do not use "
                "(apache/iceberg#17501); compactor does not read or write such manifests"
            )
