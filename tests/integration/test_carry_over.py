"""A manifest carried over into a commit without the files it removes, read an entry at a time."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField

from compactor.commit.snapshot_writer import SnapshotWriter, carry_over
from compactor.iceberg.pyiceberg_compat import manifest_entries, snapshot_manifests

SCHEMA = Schema(NestedField(1, "part", LongType(), required=False))
SPEC = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "part"))


def _manifest_of_five(catalog: Catalog) -> tuple[Table, ManifestFile, list[str]]:
    """A table whose one manifest holds five data files, in the order it lists them."""
    table = catalog.create_table("db.t", SCHEMA, partition_spec=SPEC)
    table.append(pa.table({"part": pa.array(range(5), pa.int64())}))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    (manifest,) = snapshot_manifests(table.io, snapshot, 2)
    entries = manifest_entries(table.io, manifest, 2)
    assert len(entries) == 5
    return table, manifest, [e.data_file.file_path for e in entries]


@pytest.mark.parametrize(
    "removed_at",
    [(), (0,), (4,), (1, 3), (0, 1, 2, 3, 4), (0, 2, 4), (3, 4)],
    ids=["none", "first", "last", "inner", "all", "alternate", "tail"],
)
def test_a_carried_manifest_keeps_the_other_entries_in_order_as_existing(
    catalog: Catalog, removed_at: tuple[int, ...]
) -> None:
    table, manifest, paths = _manifest_of_five(catalog)
    remove = {paths[i] for i in removed_at}
    attempt = SnapshotWriter(table, 1, None)
    seen: list[tuple[str, ManifestEntry]] = []

    carried = carry_over(attempt, manifest, remove, lambda key, e: seen.append((key, e)))

    assert [key for key, _ in seen] == [paths[i] for i in removed_at]
    assert all(e.data_file.file_path == key for key, e in seen)
    kept = [p for p in paths if p not in remove]
    if not removed_at:
        assert carried is manifest and attempt.written == []
    elif not kept:
        assert carried is None and attempt.written == []
    else:
        assert carried is not None and attempt.written == [carried.manifest_path]
        entries = manifest_entries(table.io, carried, 2)
        assert [e.data_file.file_path for e in entries] == kept
        assert {e.status for e in entries} == {ManifestEntryStatus.EXISTING}
        original = {e.data_file.file_path: e for e in manifest_entries(table.io, manifest, 2)}
        for e in entries:
            before = original[e.data_file.file_path]
            assert (e.snapshot_id, e.sequence_number, e.file_sequence_number) == (
                before.snapshot_id,
                before.sequence_number,
                before.file_sequence_number,
            )
