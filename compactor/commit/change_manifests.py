"""A snapshot's own manifests, written while the commit is built, and its summary's counts.

A commit that replaces 100,000 files finds their entries in the manifests it carries over;
each entry, with every column's metrics, takes about 10 KB as Python objects. Each is written
as a DELETED entry the moment it is found and let go of: what stays in memory is its key and
its encoded bytes (a few hundred), so a commit's memory follows its manifests, not the
number of files it replaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack

from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.utils.properties import property_as_int

from compactor.commit.snapshot_writer import SnapshotWriter


def summary_collector(metadata: TableMetadata) -> SnapshotSummaryCollector:
    """A collector of a snapshot's added and removed files, with the table's partition-summary
    limit."""
    limit = property_as_int(metadata.properties, TableProperties.WRITE_PARTITION_SUMMARY_LIMIT, 0)
    return SnapshotSummaryCollector(partition_summary_limit=limit or 0)


def replace_summary(
    collector: SnapshotSummaryCollector, head: Snapshot, props: Mapping[str, str]
) -> Summary:
    """The ``replace`` snapshot's summary over ``head``: ``collector``'s counts and totals."""
    # pyiceberg totals only "overwrite"-like operations; compute them so, then relabel.
    totals = update_snapshot_summaries(
        Summary(operation=Operation.OVERWRITE, **collector.build(), **props),
        previous_summary=head.summary.additional_properties if head.summary else None,
    )
    return Summary(operation=Operation.REPLACE, **totals.additional_properties)


class ChangeManifests:
    """One manifest per (spec, content) of the snapshot being built: an ADDED entry for each
    file it adds, a DELETED entry for each file it removes, written as they come.

    Of a removed file it keeps the key (:func:`~compactor.iceberg.pyiceberg_compat.delete_file_key`),
    and the data file when it is a delete file (callers report those); both kinds are counted
    in :attr:`summary`. :meth:`close` writes the manifests and returns them; an attempt that is
    given up is closed, then discarded with its other files.
    """

    def __init__(self, attempt: SnapshotWriter) -> None:
        self._attempt = attempt
        metadata = attempt.table.metadata
        self._schema, self._specs = metadata.schema(), metadata.specs()
        self._writers: dict[tuple[int, ManifestContent], ManifestWriter] = {}
        self._open = ExitStack()
        self._removed: set[str] = set()
        self.removed_delete_files: dict[str, DataFile] = {}
        self.summary = summary_collector(metadata)
        self.entries = 0

    def __contains__(self, key: object) -> bool:
        """Whether the file of ``key`` was removed."""
        return key in self._removed

    def add(self, data_file: DataFile, data_sequence_number: int | None) -> None:
        """An ADDED entry for ``data_file``, with that data sequence number (None: the
        snapshot's)."""
        self._write(
            data_file,
            ManifestEntry.from_args(
                status=ManifestEntryStatus.ADDED,
                snapshot_id=self._attempt.snapshot_id,
                sequence_number=data_sequence_number,
                file_sequence_number=None,
                data_file=data_file,
            ),
        )
        self.summary.add_file(
            data_file, schema=self._schema, partition_spec=self._specs[data_file.spec_id]
        )

    def remove(self, key: str, entry: ManifestEntry) -> None:
        """A DELETED entry for the live ``entry`` (once per key), its sequence numbers kept."""
        if key in self._removed:
            return
        self._removed.add(key)
        data_file = entry.data_file
        self._write(
            data_file,
            ManifestEntry.from_args(
                status=ManifestEntryStatus.DELETED,
                snapshot_id=self._attempt.snapshot_id,
                sequence_number=entry.sequence_number,
                file_sequence_number=entry.file_sequence_number,
                data_file=data_file,
            ),
        )
        self.summary.remove_file(
            data_file, schema=self._schema, partition_spec=self._specs[data_file.spec_id]
        )
        if data_file.content != DataFileContent.DATA:
            self.removed_delete_files[key] = data_file

    def _write(self, data_file: DataFile, entry: ManifestEntry) -> None:
        content = (
            ManifestContent.DATA
            if data_file.content == DataFileContent.DATA
            else ManifestContent.DELETES
        )
        key = (data_file.spec_id, content)
        writer = self._writers.get(key)
        if writer is None:
            writer = self._open.enter_context(self._attempt.manifest_writer(*key))
            self._writers[key] = writer
        writer.add_entry(entry)
        self.entries += 1

    def close(self) -> list[ManifestFile]:
        """Write the manifests; they come data first, each content by spec id."""
        self._open.close()
        ordered = sorted(self._writers.items(), key=lambda kv: (kv[0][1].value, kv[0][0]))
        return [writer.to_manifest_file() for _, writer in ordered]
