"""Find and delete files under a table's location that no metadata of the table references.

Order matters for safety: storage is listed first, then the run record is read, then the table
is refreshed and its references and the other tables of its catalog are read, so a file
recorded, committed or claimed by a table in between is seen. Files younger than the cut-off
(default 3 days) are never deleted, which protects commits still in flight; a cut-off less than
``MIN_ORPHAN_AGE_MS`` (1 day) ago must be allowed explicitly. Every file a run record lists
(``metadata/compactor-run.{0,1}.json``, live or abandoned) is kept: the next compaction run
cleans up after an abandoned one. Paths are compared as location keys (``s3a``/``s3n``/``s3``,
``file:`` forms and percent-encoding made equal). Symlinks, odd locations, anything outside the
table's location and anything under another table's location (:mod:`compactor.maintain.guards`) are
refused; so are tables with ``gc.enabled=false``. The intent files of a run that has a record
(``metadata/compactor-intent-<run id>-*``) and the files they list are kept like the record's.
So is the table's quarantine (``metadata/compactor-quarantine.json``, :mod:`compactor.quarantine`).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compactor.commit.inflight import RECORD_SLOTS, read_record, recorded_files
from compactor.durations import format_duration, format_time, parse_cutoff
from compactor.errors import UsageError
from compactor.iceberg.references import FileRef, referenced_keys
from compactor.maintain.expire import MAX_LISTED_PATHS, DeletionReport, delete_unreachable
from compactor.maintain.guards import (
    REMOVE_ORPHANS,
    check_gc_enabled,
    other_tables_fences,
    tables_in_listing,
)
from compactor.options.defaults import DEFAULT_ORPHAN_AGE, MIN_ORPHAN_AGE_MS
from compactor.quarantine import quarantine_path
from compactor.storage.deleter import OpenUpload, abort_uploads, list_open_uploads
from compactor.storage.listing import StoredFile, list_files
from compactor.storage.paths import UnsafePathError, is_within, location_key

ORPHAN_DATA = "data_files"
ORPHAN_METADATA = "metadata_files"


def _protected_metadata(table: Table) -> set[str]:
    """Metadata the table uses that no snapshot lists: table metadata files, run records and
    the quarantine."""
    location = table.metadata.location.rstrip("/")
    paths = {table.metadata_location, *(e.metadata_file for e in table.metadata.metadata_log)}
    paths |= {f"{location}/metadata/{name}" for name in RECORD_SLOTS}
    paths.add(quarantine_path(table))
    paths.add(f"{location}/metadata/version-hint.text")
    return {location_key(p) for p in paths}


def _run_record_files(table: Table) -> set[str]:
    """Keys of every file the table's run record covers, whether its run is live or not.

    That is every file the record lists, every intent file of a run the record names
    (:mod:`compactor.rewrite.intent`), and every file those list. A slot torn by a crash is skipped
    (:func:`compactor.commit.inflight.read_record`): a run records each file before creating it, so
    the intact slot lists every file that exists. Intent files of runs no record names are
    ordinary files: orphans once older than the cut-off.
    """
    record = read_record(table)
    files, intents = recorded_files(table, record) if record is not None else ([], [])
    keys = set()
    for path in [*files, *intents]:
        try:
            keys.add(location_key(path))
        except UnsafePathError:
            keys.add(path)
    return keys


@dataclass
class OrphanScan:
    """What a listing of the table's location found."""

    listed: int = 0
    orphans: list[FileRef] = field(default_factory=list)
    too_young: int = 0
    refused: list[str] = field(default_factory=list)
    in_run_record: int = 0
    other_tables: Counter[str] = field(default_factory=Counter)  # owning table -> files
    # Multipart uploads begun before the cut-off and never finished (object stores only).
    open_uploads: list[OpenUpload] = field(default_factory=list)


def sweep_root(table: Table, identifier: str, location: str | None) -> str:
    """Where a sweep lists: the table's location, or ``location`` (Spark's ``location``) when
    it is a sub-path of it, given in full or relative to the table's location."""
    root = table.metadata.location.rstrip("/")
    if location is None:
        return root
    full = location if "://" in location or location.startswith("/") else f"{root}/{location}"
    if not is_within(full, root):
        raise UsageError(
            f"table {identifier}: location {location!r} is not under the table's location {root}",
            "location",
        )
    return full.rstrip("/")


def find_orphans(
    table: Table, cutoff_ms: int, *, catalog: Catalog | None = None, root: str | None = None
) -> OrphanScan:
    """List the table's location (or ``root``, under it), then compare with everything its
    metadata references.

    ``catalog`` (default: the one the table was loaded from) is listed for the other tables'
    locations, which are never swept.
    """
    root = root or table.metadata.location
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spill:
        listing = _SpilledListing(spill, list_files(table.io, root))
        return _compare(table, listing, cutoff_ms, catalog, root)


class _SpilledListing:
    """A storage listing written to ``spill`` (a temporary file), not held in memory, with each
    file's location key (None for a location that has none); iterated as often as needed."""

    def __init__(self, spill: IO[str], files: Iterable[StoredFile]) -> None:
        self._file = spill
        self.count = 0
        for f in files:
            try:
                key: str | None = location_key(f.location)
            except UnsafePathError:
                key = None
            self._file.write(json.dumps([f.location, f.size, f.mtime_ms, f.symlink, key]) + "\n")
            self.count += 1

    def __iter__(self) -> Iterator[tuple[StoredFile, str | None]]:
        self._file.seek(0)
        for line in self._file:
            *stored, key = json.loads(line)
            yield StoredFile(*stored), key


def _compare(
    table: Table, listing: _SpilledListing, cutoff_ms: int, catalog: Catalog | None, root: str
) -> OrphanScan:
    """The scan of ``listing`` (of ``root``) against the table's references, read after it."""
    # The run record (and its runs' intent files) before the metadata: a run records each file
    # before creating it, and releases its record only after committing or deleting its files,
    # so a listed file is in one or the other.
    recorded = _run_record_files(table)
    table.refresh()
    identifier = ".".join(table.name())
    check_gc_enabled(table, identifier, REMOVE_ORPHANS)
    fences = other_tables_fences(catalog or table.catalog, table, identifier, sweep=True)
    tables_in_listing(table, (key for _, key in listing if key is not None), fences)
    referenced = referenced_keys(table, also=_protected_metadata(table))
    inside = location_key(table.metadata.location).rstrip("/") + "/"
    metadata = inside + "metadata/"
    scan = OrphanScan(listed=listing.count)
    for stored, key in listing:
        if key is None or stored.symlink or not key.startswith(inside):
            scan.refused.append(stored.location)
        elif (owner := fences.owner_of(key)) is not None:
            scan.other_tables[owner] += 1
        elif key in referenced:
            continue
        elif key in recorded:
            scan.in_run_record += 1
        elif stored.mtime_ms >= cutoff_ms:
            scan.too_young += 1
        else:
            kind = ORPHAN_METADATA if key.startswith(metadata) else ORPHAN_DATA
            scan.orphans.append(FileRef(stored.location, kind, stored.size))
    for upload in list_open_uploads(table.io, root):
        if (
            is_within(upload.location, table.metadata.location)
            and fences.owner(upload.location) is None
            and location_key(upload.location) not in recorded  # a live run's, still uploading
            and upload.initiated_ms < cutoff_ms
        ):
            scan.open_uploads.append(upload)
    return scan


@dataclass
class OrphanResult:
    """What ``compactor orphans`` did; ``to_dict`` is its ``--json`` output."""

    table: str
    dry_run: bool
    cutoff_ms: int
    scan: OrphanScan
    report: DeletionReport
    failed_uploads: list[OpenUpload] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def orphan_locations(self) -> list[str]:
        """Every orphan file's location, sorted."""
        return sorted(ref.location for ref in self.scan.orphans)

    @property
    def listed_orphans(self) -> list[str]:
        """The orphan files' locations, sorted: at most MAX_LISTED_PATHS."""
        return self.orphan_locations[:MAX_LISTED_PATHS]

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "older_than_ms": self.cutoff_ms,
            "listed_files": self.scan.listed,
            "orphan_files": len(self.scan.orphans),
            "skipped_too_young": self.scan.too_young,
            "skipped_in_run_record": self.scan.in_run_record,
            "skipped_other_tables": dict(sorted(self.scan.other_tables.items())),
            "refused": self.scan.refused,
            **self.report.to_dict(),
            "orphans": self.listed_orphans,
            "open_uploads": len(self.scan.open_uploads),
            "aborted_uploads": 0
            if self.dry_run
            else len(self.scan.open_uploads) - len(self.failed_uploads),
            "duration_ms": round(self.duration_s * 1000),
        }


FLOOR_REASON = (
    f"the {format_duration(MIN_ORPHAN_AGE_MS)} safety floor of orphan removal (files of commits "
    "and compaction runs in flight could be deleted)"
)


def orphan_cutoff(older_than: str | None, now_ms: int, *, allow_short: bool = False) -> int:
    """The cut-off for ``--older-than`` (default: ``DEFAULT_ORPHAN_AGE`` ago).

    Less than ``MIN_ORPHAN_AGE_MS`` ago is a usage error unless ``allow_short``.
    """
    cutoff = parse_cutoff(older_than or DEFAULT_ORPHAN_AGE, "--older-than", now_ms)
    if cutoff > now_ms - MIN_ORPHAN_AGE_MS and not allow_short:
        raise UsageError(
            f"--older-than {older_than} is below {FLOOR_REASON}; add --allow-short-older-than "
            "to go below it"
        )
    return cutoff


def remove_orphans(
    table: Table,
    identifier: str,
    cutoff_ms: int,
    *,
    catalog: Catalog | None = None,
    dry_run: bool = False,
    allow_short_older_than: bool = False,
    clock: Callable[[], float] = time.time,
    location: str | None = None,
) -> OrphanResult:
    """Delete (or list, when ``dry_run``) the table's orphan files older than ``cutoff_ms``.

    ``catalog`` (default: the one the table was loaded from) is listed so that no other table's
    location is swept. A cut-off less than ``MIN_ORPHAN_AGE_MS`` before ``clock()`` needs
    ``allow_short_older_than``. ``location`` limits the sweep to a sub-path of the table's
    location (see :func:`sweep_root`).
    """
    root = sweep_root(table, identifier, location)
    started = time.monotonic()
    now_ms = int(clock() * 1000)
    if cutoff_ms > now_ms - MIN_ORPHAN_AGE_MS and not allow_short_older_than:
        raise UsageError(
            f"table {identifier}: orphan cut-off {format_time(cutoff_ms)} is less than "
            f"{format_duration(MIN_ORPHAN_AGE_MS)} ago, below {FLOOR_REASON}; pass "
            "allow_short_older_than=True (--allow-short-older-than) to allow it"
        )
    check_gc_enabled(table, identifier, REMOVE_ORPHANS)
    scan = find_orphans(table, cutoff_ms, catalog=catalog, root=root)
    report = DeletionReport(dry_run)
    delete_unreachable(table, scan.orphans, dry_run=dry_run, report=report)
    failed_uploads = [] if dry_run else abort_uploads(table.io, scan.open_uploads)
    return OrphanResult(
        identifier, dry_run, cutoff_ms, scan, report, failed_uploads, time.monotonic() - started
    )
