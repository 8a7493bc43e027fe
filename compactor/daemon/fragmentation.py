"""Score how fragmented a table is, cheaply enough to do every minute for every table.

The current snapshot's summary comes first: a table whose totals cannot cross a threshold is
scored without reading any manifest. Otherwise manifests are read through a per-table
:class:`~compactor.planning.health.ManifestCache`, so only manifests added since the last scan are read,
and a table whose snapshot has not changed has no manifest read. The scores count each
partition's delete files too, from which :mod:`compactor.daemon.remedies` picks a remedy.

Files in the table's quarantine (:mod:`compactor.quarantine`) are not counted as small: a
compaction leaves them out. The quarantine is read once per scan (with the one request per entry
a run makes too); while it holds small data files, the manifests are searched for their
partitions, each manifest once per quarantine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table

from compactor.daemon.jobfiles import CompactAction, RewriteDeletesAction
from compactor.daemon.remedies import (
    PartitionFiles,
    Remedies,
    choose_remedies,
    compaction_reasons,
    rewrite_deletes_reasons,
)
from compactor.iceberg.pyiceberg_compat import manifest_entries
from compactor.options.defaults import DEFAULT_MIN_INPUT_FILES, MIN_FILE_SIZE_RATIO
from compactor.planning.health import ManifestCache, TableHealth, table_health
from compactor.planning.planner import partition_path
from compactor.quarantine import Quarantine
from compactor.sizes import format_size, parse_size

SUMMARY = "summary"
MANIFESTS = "manifests"


@dataclass(frozen=True)
class Thresholds:
    """What a job scores its tables against: its ``[compact]`` and ``[rewrite_deletes]``
    sections (either may be missing)."""

    compact: CompactAction | None
    deletes: RewriteDeletesAction | None

    @property
    def min_input_files(self) -> int:
        return self.compact.min_input_files if self.compact else DEFAULT_MIN_INPUT_FILES

    def crossed_by(self, data_files: int, delete_files: int) -> bool:
        """Whether a table with these totals may cross a threshold (else its manifests need
        not be read)."""
        compact = self.compact
        if compact is not None and (
            data_files >= compact.min_small_files
            or delete_files >= compact.min_delete_files
            or compact.min_small_bytes is not None
        ):
            return True
        return self.deletes is not None and delete_files >= self.deletes.fewest_delete_files


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
    format_version: int = 2
    # The partitions holding delete files (none when scored from the summary).
    delete_partitions: tuple[PartitionFiles, ...] = ()

    @property
    def score(self) -> int:
        """Files a compaction would take off every query's plan: higher is worse."""
        return (self.small_files or 0) + self.delete_files

    def remedies(self, thresholds: Thresholds) -> Remedies:
        """The remedy of each partition's delete files (see :mod:`compactor.daemon.remedies`)."""
        return choose_remedies(
            self.delete_partitions,
            self.format_version,
            thresholds.deletes,
            thresholds.compact is not None,
        )

    def to_dict(self) -> dict[str, object]:
        shown = {k: v for k, v in asdict(self).items() if k not in _NOT_SHOWN}
        return {**shown, "score": self.score}


_NOT_SHOWN = ("format_version", "delete_partitions")


def due_reasons(
    fragmentation: Fragmentation,
    section: CompactAction,
    deletes: RewriteDeletesAction | None = None,
) -> list[str]:
    """The thresholds of ``section`` the table crosses; empty when it needs no compaction.
    Equality-delete files that the job's ``deletes`` section converts are not counted against
    ``min_delete_files``."""
    remedies = fragmentation.remedies(Thresholds(section, deletes))
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
    delete_files = fragmentation.delete_files - remedies.left_to_conversion
    if delete_files >= section.min_delete_files:
        converted = " not converted" if remedies.left_to_conversion else ""
        reasons.append(
            f"{delete_files} delete files{converted} >= min_delete_files {section.min_delete_files}"
        )
    if deletes is not None:
        reasons.extend(compaction_reasons(remedies, deletes))
    return reasons


def deletes_due_reasons(
    fragmentation: Fragmentation, compact: CompactAction | None, deletes: RewriteDeletesAction
) -> tuple[list[str], bool]:
    """Why ``deletes`` is due for the table (empty when it is not), and whether equality
    deletes are due for conversion, in a job compacting with ``compact`` (None: it does not)."""
    remedies = fragmentation.remedies(Thresholds(compact, deletes))
    return rewrite_deletes_reasons(remedies, deletes), bool(remedies.convert)


def _delete_partitions(health: TableHealth) -> tuple[PartitionFiles, ...]:
    found = []
    for name, deletes in sorted(health.partition_deletes.items()):
        part = health.partitions.get(name)
        found.append(
            PartitionFiles(
                name,
                data_files=part.data_files if part else 0,
                small_files=part.small(health.min_input_files)[0] if part else 0,
                equality_delete_files=deletes.equality_delete_files,
                position_delete_files=deletes.position_delete_files,
            )
        )
    return tuple(found)


def _summary_int(summary: dict[str, str], name: str) -> int | None:
    value = summary.get(name)
    return int(value) if value is not None and value.isdigit() else None


# Where quarantined files are: path -> (partition, size), as one manifest lists them.
Located = dict[str, tuple[str, int]]


class FragmentationScanner:
    """Scores tables, remembering what it read: one instance per daemon."""

    def __init__(self) -> None:
        self._caches: dict[str, ManifestCache] = {}
        self._last: dict[
            str, tuple[tuple[int | None, int, Thresholds, frozenset[str]], Fragmentation]
        ] = {}
        # table -> the quarantined paths searched for, and what each manifest read holds of them.
        self._located: dict[str, tuple[frozenset[str], dict[str, Located]]] = {}

    def scan(
        self,
        table: Table,
        identifier: str,
        target_file_size: int,
        compact: CompactAction | None,
        deletes: RewriteDeletesAction | None = None,
    ) -> Fragmentation:
        """Score ``table``'s current snapshot against ``target_file_size`` and a job's
        ``[compact]`` and ``[rewrite_deletes]`` sections (either may be None)."""
        thresholds = Thresholds(compact, deletes)
        totals = summary_fragmentation(table, identifier)
        if totals is not None and not thresholds.crossed_by(totals.data_files, totals.delete_files):
            return totals
        small = int(target_file_size * MIN_FILE_SIZE_RATIO)
        quarantined = frozenset(f.path for f in Quarantine.load(table).files if f.size < small)
        snapshot = table.current_snapshot()
        snapshot_id = snapshot.snapshot_id if snapshot else None
        key = (snapshot_id, target_file_size, thresholds, quarantined)
        last = self._last.get(identifier)
        if last and last[0] == key:
            return replace(last[1], manifests_read=0)
        cache = self._caches.setdefault(identifier, ManifestCache())
        read_before = cache.manifests_read
        health = table_health(
            table, identifier, target_file_size, thresholds.min_input_files, cache
        )
        searched = self._leave_out(table, identifier, health, quarantined) if quarantined else 0
        worst = health.worst_partitions(1)
        found = Fragmentation(
            identifier,
            snapshot_id,
            health.data_files,
            health.data_bytes,
            health.delete_files,
            MANIFESTS,
            manifests_read=cache.manifests_read - read_before + searched,
            small_files=health.small_files,
            small_bytes=health.small_bytes,
            files_under_target=health.files_under_target,
            bytes_under_target=health.bytes_under_target,
            partitions=len(health.partitions),
            worst_partition=worst[0].partition if worst else None,
            worst_partition_files_under_target=worst[0].files_under_target if worst else None,
            format_version=table.metadata.format_version,
            delete_partitions=_delete_partitions(health),
        )
        self._last[identifier] = (key, found)
        return found

    def _leave_out(
        self, table: Table, identifier: str, health: TableHealth, quarantined: frozenset[str]
    ) -> int:
        """Take the ``quarantined`` small files out of ``health``'s files under target; the
        manifests read to find their partitions."""
        searched, holding = self._located.get(identifier, (frozenset(), {}))
        if searched != quarantined:
            holding = {}
        snapshot = table.current_snapshot()
        manifests = snapshot.manifests(table.io) if snapshot else []
        specs, schema = table.metadata.specs(), table.schema()
        located: Located = {}
        read = 0
        for manifest in manifests:
            if len(located) == len(quarantined):
                break
            if manifest.content != ManifestContent.DATA:
                continue
            if manifest.manifest_path not in holding:
                entries = manifest_entries(table.io, manifest, table.metadata.format_version)
                read += 1
                holding[manifest.manifest_path] = {
                    f.file_path: (
                        partition_path(specs[f.spec_id], schema, f.partition) or "(unpartitioned)",
                        f.file_size_in_bytes,
                    )
                    for f in (entry.data_file for entry in entries)
                    if f.file_path in quarantined
                }
            located.update(holding[manifest.manifest_path])
        current = {m.manifest_path for m in manifests}
        self._located[identifier] = (
            quarantined,
            {path: found for path, found in holding.items() if path in current},
        )
        small = int(health.target_file_size * MIN_FILE_SIZE_RATIO)
        for partition, size in located.values():
            part = health.partitions.get(partition)
            if part is None or size >= small:
                continue
            part.files_under_target -= 1
            part.bytes_under_target -= size
            health.files_under_target -= 1
            health.bytes_under_target -= size
        return read


def summary_fragmentation(table: Table, identifier: str) -> Fragmentation | None:
    """The table's totals from its current snapshot's summary alone (no manifest read); None
    when the summary does not give them."""
    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
    data_files = _summary_int(summary, "total-data-files")
    delete_files = _summary_int(summary, "total-delete-files")
    if data_files is None or delete_files is None:
        return None
    return Fragmentation(
        identifier,
        snapshot.snapshot_id if snapshot else None,
        data_files,
        _summary_int(summary, "total-files-size") or 0,
        delete_files,
        SUMMARY,
        manifests_read=0,
        format_version=table.metadata.format_version,
    )
