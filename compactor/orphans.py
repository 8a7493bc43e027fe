"""Find and delete files under a table's location that no metadata of the table references.

Order matters for safety: storage is listed first, then the table is refreshed and its
references computed, so a file committed in between is seen as referenced; files younger than
the cut-off (default 3 days) are never deleted, which protects commits still in flight. Paths
are compared as location keys (``s3a``/``s3n``/``s3``, ``file:`` forms and percent-encoding
made equal). Symlinks, odd locations and anything outside the table's location are refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.table import Table

from compactor.durations import DAY_MS, parse_cutoff
from compactor.expire import DeletionReport, delete_unreachable
from compactor.inflight import RECORD_SLOTS
from compactor.paths import UnsafePathError, is_within, location_key
from compactor.references import FileRef, table_references
from compactor.storage import StoredFile, list_files

DEFAULT_ORPHAN_AGE_MS = 3 * DAY_MS
ORPHAN_DATA = "data_files"
ORPHAN_METADATA = "metadata_files"


def _protected_metadata(table: Table) -> set[str]:
    """Metadata the table uses that no snapshot lists: table metadata files and run records."""
    location = table.metadata.location.rstrip("/")
    paths = {table.metadata_location, *(e.metadata_file for e in table.metadata.metadata_log)}
    paths |= {f"{location}/metadata/{name}" for name in RECORD_SLOTS}
    paths.add(f"{location}/metadata/version-hint.text")
    return {location_key(p) for p in paths}


@dataclass
class OrphanScan:
    """What a listing of the table's location found."""

    listed: int = 0
    orphans: list[FileRef] = field(default_factory=list)
    too_young: int = 0
    refused: list[str] = field(default_factory=list)


def _kind(location: str, table_location: str) -> str:
    inside_metadata = location_key(location).startswith(
        location_key(table_location.rstrip("/") + "/metadata") + "/"
    )
    return ORPHAN_METADATA if inside_metadata else ORPHAN_DATA


def find_orphans(table: Table, cutoff_ms: int) -> OrphanScan:
    """List the table's location, then compare with everything its metadata references."""
    listing: list[StoredFile] = list(list_files(table.io, table.metadata.location))
    table.refresh()
    referenced = table_references(table).keys() | _protected_metadata(table)
    scan = OrphanScan(listed=len(listing))
    for stored in listing:
        try:
            key = location_key(stored.location)
        except UnsafePathError:
            scan.refused.append(stored.location)
            continue
        if stored.symlink or not is_within(stored.location, table.metadata.location):
            scan.refused.append(stored.location)
        elif key in referenced:
            continue
        elif stored.mtime_ms >= cutoff_ms:
            scan.too_young += 1
        else:
            kind = _kind(stored.location, table.metadata.location)
            scan.orphans.append(FileRef(stored.location, kind, stored.size))
    return scan


@dataclass
class OrphanResult:
    """What ``compactor orphans`` did; ``to_dict`` is its ``--json`` output."""

    table: str
    dry_run: bool
    cutoff_ms: int
    scan: OrphanScan
    report: DeletionReport
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "older_than_ms": self.cutoff_ms,
            "listed_files": self.scan.listed,
            "orphan_files": len(self.scan.orphans),
            "skipped_too_young": self.scan.too_young,
            "refused": self.scan.refused,
            **self.report.to_dict(),
            "orphans": [ref.location for ref in self.scan.orphans] if self.dry_run else [],
            "duration_s": round(self.duration_s, 3),
        }


def orphan_cutoff(older_than: str | None, now_ms: int) -> int:
    """The cut-off for ``--older-than`` (default: 3 days ago)."""
    if older_than is None:
        return now_ms - DEFAULT_ORPHAN_AGE_MS
    return parse_cutoff(older_than, "--older-than", now_ms)


def remove_orphans(
    table: Table,
    identifier: str,
    cutoff_ms: int,
    *,
    dry_run: bool = False,
) -> OrphanResult:
    """Delete (or list, when ``dry_run``) the table's orphan files older than ``cutoff_ms``."""
    started = time.monotonic()
    scan = find_orphans(table, cutoff_ms)
    report = DeletionReport()
    delete_unreachable(table, scan.orphans, dry_run=dry_run, report=report)
    return OrphanResult(identifier, dry_run, cutoff_ms, scan, report, time.monotonic() - started)
