"""Score how fragmented a table is, cheaply enough to do every minute for every table.

The current snapshot's summary comes first: a table whose totals cannot cross a threshold is
scored without reading any manifest. Otherwise manifests are read through a per-table
:class:`~compactor.planning.health.ManifestCache`, so only manifests added since the last scan are read,
and a table whose snapshot has not changed is not read at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from pyiceberg.table import Table

from compactor.daemon.jobfiles import CompactAction
from compactor.planning.health import ManifestCache, table_health
from compactor.sizes import format_size, parse_size

SUMMARY = "summary"
MANIFESTS = "manifests"


@dataclass(frozen=True)
class Fragmentation:
    """A table's fragmentation at one snapshot."""

    table: str
    snapshot_id: int | None
    data_files: int
    data_bytes: int
    delete_files: int
    source: str  # SUMMARY or MANIFESTS
    manifests_read: int
    # None when scored from the summary alone:
    small_files: int | None = None  # files a compaction would rewrite, as in `compactor inspect`
    small_bytes: int | None = None
    files_under_target: int | None = None  # every file under 75% of the target
    bytes_under_target: int | None = None
    partitions: int | None = None
    worst_partition: str | None = None
    worst_partition_files_under_target: int | None = None

    @property
    def score(self) -> int:
        """Files a compaction would take off every query's plan: higher is worse."""
        return (self.small_files or 0) + self.delete_files

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "score": self.score}


def due_reasons(fragmentation: Fragmentation, section: CompactAction) -> list[str]:
    """The thresholds of ``section`` the table crosses; empty when it needs no compaction."""
    reasons = []
    small_files = fragmentation.small_files or 0
    if small_files >= section.min_small_files:
        reasons.append(f"{small_files} small files >= min_small_files {section.min_small_files}")
    if section.min_small_bytes is not None:
        limit = parse_size(section.min_small_bytes)
        small_bytes = fragmentation.small_bytes or 0
        if small_bytes >= limit:
            reasons.append(
                f"{format_size(small_bytes)} in small files >= min_small_bytes {format_size(limit)}"
            )
    if fragmentation.delete_files >= section.min_delete_files:
        reasons.append(
            f"{fragmentation.delete_files} delete files >= min_delete_files {section.min_delete_files}"
        )
    return reasons


def _summary_int(summary: dict[str, str], name: str) -> int | None:
    value = summary.get(name)
    return int(value) if value is not None and value.isdigit() else None


class FragmentationScanner:
    """Scores tables, remembering what it read: one instance per daemon."""

    def __init__(self) -> None:
        self._caches: dict[str, ManifestCache] = {}
        self._last: dict[str, tuple[tuple[int | None, int, CompactAction], Fragmentation]] = {}

    def scan(
        self, table: Table, identifier: str, target_file_size: int, section: CompactAction
    ) -> Fragmentation:
        """Score ``table``'s current snapshot against ``target_file_size``."""
        snapshot = table.current_snapshot()
        snapshot_id = snapshot.snapshot_id if snapshot else None
        key = (snapshot_id, target_file_size, section)
        last = self._last.get(identifier)
        if last and last[0] == key:
            return replace(last[1], manifests_read=0)
        summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
        data_files = _summary_int(summary, "total-data-files")
        delete_files = _summary_int(summary, "total-delete-files")
        if (
            data_files is not None
            and delete_files is not None
            and data_files < section.min_small_files
            and delete_files < section.min_delete_files
            and section.min_small_bytes is None
        ):
            found = Fragmentation(
                identifier,
                snapshot_id,
                data_files,
                _summary_int(summary, "total-files-size") or 0,
                delete_files,
                SUMMARY,
                manifests_read=0,
            )
        else:
            cache = self._caches.setdefault(identifier, ManifestCache())
            read_before = cache.manifests_read
            health = table_health(
                table, identifier, target_file_size, section.min_input_files, cache
            )
            worst = health.worst_partitions(1)
            found = Fragmentation(
                identifier,
                snapshot_id,
                health.data_files,
                health.data_bytes,
                health.delete_files,
                MANIFESTS,
                manifests_read=cache.manifests_read - read_before,
                small_files=health.small_files,
                small_bytes=health.small_bytes,
                files_under_target=health.files_under_target,
                bytes_under_target=health.bytes_under_target,
                partitions=len(health.partitions),
                worst_partition=worst[0].partition if worst else None,
                worst_partition_files_under_target=worst[0].files_under_target if worst else None,
            )
        self._last[identifier] = (key, found)
        return found
