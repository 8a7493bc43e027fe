"""A commit's own manifests: DELETED entries written as they are found, once per file, with
their metrics and sequence numbers, and counted in the snapshot's summary."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table

from compactor.commit.change_manifests import ChangeManifests
from compactor.commit.snapshot_writer import SnapshotWriter
from compactor.iceberg.pyiceberg_compat import (
    delete_file_key,
    manifest_entries,
)

from support.tables import live_entries


def _table(catalog: Catalog, appends: int = 3) -> Table:
    table = catalog.create_table("db.t", pa.schema([("id", pa.int64()), ("s", pa.string())]))
    for i in range(appends):
        table.append(pa.table({"id": [i, i + 10], "s": [f"v{i}", None]}))
    return table


def test_each_removed_file_is_written_once_as_deleted_with_its_metrics(catalog: Catalog) -> None:
    table = _table(catalog)
    entries = live_entries(table)
    attempt = SnapshotWriter(table, table.metadata.new_snapshot_id(), None)
    changes = ChangeManifests(attempt)
    for entry in [*entries, entries[0]]:  # a file met twice is removed once
        changes.remove(delete_file_key(entry.data_file), entry)
    manifests = changes.close()

    assert len(manifests) == 1 and changes.entries == len(entries)
    assert all(delete_file_key(e.data_file) in changes for e in entries)
    written = manifest_entries(table.io, manifests[0], 2, discard_deleted=False)
    assert [e.status for e in written] == [ManifestEntryStatus.DELETED] * len(entries)
    by_path = {e.data_file.file_path: e for e in entries}
    for e in written:
        before = by_path[e.data_file.file_path]
        assert e.data_file == before.data_file  # metrics and all
        assert e.sequence_number == before.sequence_number
        assert e.file_sequence_number == before.file_sequence_number
    summary = changes.summary.build()
    assert summary["deleted-data-files"] == str(len(entries))
    assert summary["deleted-records"] == str(sum(e.data_file.record_count for e in entries))
    attempt.discard()
