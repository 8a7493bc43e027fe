"""Tables partitioned on a fixed column: refused before anything is read into a plan, committed
or deleted, because Iceberg Java and the Avro spec encode their manifests' partition values
differently (see compactor.iceberg.interop); tables of imported files (a migration's
``add_files``, no field ids) as well."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import FixedType, LongType, NestedField

from compactor.errors import UnsupportedTableError
from compactor.maintain.orphans import remove_orphans

from support.runs import run_compaction
from support.tables import append_rows, list_files, local_path

SCHEMA = Schema(NestedField(1, "id", LongType()), NestedField(2, "fx", FixedType(4)))

pytestmark = pytest.mark.usefixtures("read_path", "file_kind")


def _table(catalog: Catalog, spec: PartitionSpec) -> None:
    table = catalog.create_table("db.t", SCHEMA, partition_spec=spec)
    for first in (0, 4):
        rows = [{"id": i, "fx": (i % 2).to_bytes(4, "big")} for i in range(first, first + 4)]
        append_rows(table, pa.Table.from_pylist(rows, SCHEMA.as_arrow()))


def test_compaction_and_orphan_removal_refuse_a_fixed_partition(catalog: Catalog) -> None:
    _table(catalog, PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "fx")))
    table = catalog.load_table("db.t")
    snapshot, root = table.current_snapshot(), local_path(table.location())
    orphan = root / "data" / "left-by-a-crash.parquet"
    orphan.write_bytes(b"not referenced")
    files = list_files(root)

    with pytest.raises(UnsupportedTableError, match=r"partition field 'fx' is fixed\[4\]"):
        run_compaction(catalog, "db.t", min_input_files=2)
    with pytest.raises(UnsupportedTableError, match=r"manifest .*\.avro: partition field 'fx'"):
        remove_orphans(
            table,
            "db.t",
            int(time.time() * 1000) + 86_400_000,
            catalog=catalog,
            allow_short_older_than=True,
        )

    assert catalog.load_table("db.t").current_snapshot() == snapshot
    assert list_files(root) == files  # nothing written, nothing deleted (the orphan included)


def test_moving_rows_into_a_fixed_partition_is_refused(catalog: Catalog) -> None:
    _table(catalog, PartitionSpec())
    table = catalog.load_table("db.t")
    with table.update_spec() as update:
        update.add_identity("fx")
    snapshot = catalog.load_table("db.t").current_snapshot()

    with pytest.raises(UnsupportedTableError, match=r"output_spec_id 1: partition field 'fx'"):
        run_compaction(catalog, "db.t", output_spec_id=1)
    assert catalog.load_table("db.t").current_snapshot() == snapshot
