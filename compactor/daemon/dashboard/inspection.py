"""What the dashboard reads from a table itself: file sizes, partitions, deletes over time.

Read-only: a table's metadata and manifests, never a data file. Manifests are immutable, so what
was counted of one is kept (for the snapshots last shown) and a table whose snapshot has not
changed is not read again.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Any

from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from compactor.daemon.jobfiles import Job
from compactor.iceberg.pyiceberg_compat import manifest_entries
from compactor.options.compact import resolve_options
from compactor.options.defaults import DEFAULT_MIN_INPUT_FILES
from compactor.planning.health import DELETE_KINDS, ManifestCache, TableHealth, table_health

# Upper bounds of the file-size histogram's buckets: 4 KiB, 16 KiB ... 1 GiB, then the rest.
SIZE_BUCKETS = tuple(1024 * 4**k for k in range(1, 11))
# Snapshots shown in a table's deletes-over-time chart, the latest.
SNAPSHOTS_SHOWN = 200


@dataclass(frozen=True)
class SizeHistogram:
    """Data files of one snapshot per size bucket (``SIZE_BUCKETS``, then larger)."""

    snapshot_id: int
    at_ms: int
    counts: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "at_ms": self.at_ms, "counts": list(self.counts)}


@dataclass(frozen=True)
class Inspection:
    """A table's current snapshot as the dashboard shows it."""

    snapshot_id: int | None
    target_file_size: int
    manifests: int
    health: TableHealth
    sizes: SizeHistogram | None

    @property
    def delete_files_by_kind(self) -> dict[str, int]:
        counts = (
            self.health.position_delete_files,
            self.health.equality_delete_files,
            self.health.deletion_vectors,
        )
        return dict(zip(DELETE_KINDS, counts, strict=True))


def deletes_over_time(table: Table) -> list[dict[str, Any]]:
    """Files and deleted rows by kind after each snapshot still in the metadata (the last
    ``SNAPSHOTS_SHOWN``), from snapshot summaries alone."""
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
    shown = []
    for snapshot in snapshots[-SNAPSHOTS_SHOWN:]:
        summary = snapshot.summary
        values = summary.additional_properties if summary else {}
        shown.append(
            {
                "snapshot_id": snapshot.snapshot_id,
                "at_ms": snapshot.timestamp_ms,
                "operation": summary.operation.value if summary else None,
                "data_files": _number(values.get("total-data-files")),
                "delete_files": _number(values.get("total-delete-files")),
                "position_deletes": _number(values.get("total-position-deletes")),
                "equality_deletes": _number(values.get("total-equality-deletes")),
            }
        )
    return shown


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def target_file_size(job: Job, identifier: str, table: Table) -> int:
    """The target file size the job's compaction uses for ``table``."""
    given = job.spec.compact.given() if job.spec.compact is not None else {}
    return resolve_options(identifier, table.metadata.properties, **given).plan.target_file_size


class TableReader:
    """Inspects tables for the dashboard, remembering what it counted; one per daemon."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._health: dict[str, ManifestCache] = {}
        # Table -> size counts of the manifests of the snapshots last shown, by manifest path.
        self._sizes: dict[str, dict[str, tuple[int, ...]]] = {}

    def inspect(self, job: Job, identifier: str, table: Table) -> Inspection:
        """Count the current snapshot's files by size, partition and delete kind."""
        target = target_file_size(job, identifier, table)
        snapshot = table.current_snapshot()
        with self._lock:
            cache = self._health.setdefault(identifier, ManifestCache())
            health = table_health(table, identifier, target, _min_input_files(job), cache)
        manifests = len(snapshot.manifests(table.io)) if snapshot else 0
        sizes = self.sizes(identifier, table, [snapshot])[0] if snapshot else None
        return Inspection(
            snapshot.snapshot_id if snapshot else None, target, manifests, health, sizes
        )

    def sizes(
        self, identifier: str, table: Table, snapshots: list[Snapshot]
    ) -> list[SizeHistogram]:
        """The size histogram of each of ``snapshots`` (of ``table``)."""
        with self._lock:
            known = self._sizes.get(identifier, {})
        kept: dict[str, tuple[int, ...]] = {}
        found = []
        for snapshot in snapshots:
            counts = [0] * (len(SIZE_BUCKETS) + 1)
            for manifest in snapshot.manifests(table.io):
                if manifest.content != ManifestContent.DATA:
                    continue
                path = manifest.manifest_path
                if path not in kept:
                    kept[path] = known.get(path) or _manifest_sizes(table, manifest)
                counts = [a + b for a, b in zip(counts, kept[path], strict=True)]
            found.append(SizeHistogram(snapshot.snapshot_id, snapshot.timestamp_ms, tuple(counts)))
        with self._lock:
            self._sizes[identifier] = kept
        return found


def _min_input_files(job: Job) -> int:
    compact = job.spec.compact
    return compact.min_input_files if compact is not None else DEFAULT_MIN_INPUT_FILES


def _manifest_sizes(table: Table, manifest: ManifestFile) -> tuple[int, ...]:
    counts = [0] * (len(SIZE_BUCKETS) + 1)
    for entry in manifest_entries(table.io, manifest, table.metadata.format_version):
        data_file = entry.data_file
        if data_file.content == DataFileContent.DATA:
            counts[bisect.bisect_left(SIZE_BUCKETS, data_file.file_size_in_bytes)] += 1
    return tuple(counts)
