"""Expire old snapshots, then delete the files only expired snapshots could reach.

Retention follows Iceberg's RemoveSnapshots (Java): every branch keeps its head, its last
``min-snapshots-to-keep`` ancestors and every ancestor younger than ``max-snapshot-age-ms`` —
the branch's own values where it sets them, else the table's ``history.expire.*`` properties,
else the flags' defaults; tags keep their snapshot; a branch or tag older than its
``max-ref-age-ms`` is removed (``main`` never is); snapshots no ref reaches are kept while
young. The current snapshot is never expired.

Files to delete are computed from reachability: every file the table's metadata reached before
the commit, minus every file its metadata reaches after it. As in Java, the commit also drops the
statistics and partition-statistics entries of the expired snapshots; a statistics file the
metadata still lists is never deleted. Nothing outside the table's location is deleted, nor
anything under another table's location nested inside it; a table with ``gc.enabled=false``, or
sharing its location with another table of its catalog, is refused (:mod:`compactor.maintain.guards`).

The commit asserts that no branch or tag moved, vanished or appeared since the plan: pyiceberg's
``RemoveSnapshotsUpdate`` (like Java's) silently drops a ref pointing at a removed snapshot, so a
tag created on an expiring snapshot while the plan was made would vanish with it. Every existing
ref is asserted with ``AssertRefSnapshotId``; a ref *created* meanwhile cannot be named in a
REST requirement, so for catalogs that check requirements in this process (pyiceberg's
``MetastoreCatalog``: SQL, Hive, Glue) the commit also carries :class:`AssertRefsUnchanged`. On
any other catalog, the metadata the commit was applied to is read back: if the commit dropped a
ref it did not plan to drop, no file is deleted and the run fails naming the ref.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field
from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import ManifestFile
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.update import (
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
    RemovePartitionSpecsUpdate,
    RemovePartitionStatisticsUpdate,
    RemoveSchemasUpdate,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    RemoveStatisticsUpdate,
    TableRequirement,
    TableUpdate,
    ValidatableTableRequirement,
)
from pyiceberg.utils.properties import property_as_int

from compactor.commit.retry import RetryPolicy
from compactor.durations import parse_cutoff
from compactor.errors import CommitConflictError, ConfigError, UsageError, not_writable_error
from compactor.iceberg.pyiceberg_compat import snapshot_manifests
from compactor.iceberg.references import (
    FileRef,
    References,
    manifest_file_refs,
    snapshot_references,
)
from compactor.maintain.guards import (
    EXPIRE,
    Fences,
    check_gc_enabled,
    gc_enabled,
    other_tables_fences,
)
from compactor.options.defaults import DEFAULT_MAX_SNAPSHOT_AGE_MS, DEFAULT_MIN_SNAPSHOTS_TO_KEEP
from compactor.storage.deleter import delete_files
from compactor.storage.listing import list_files
from compactor.storage.paths import UnsafePathError, is_within, location_key

MAX_SNAPSHOT_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_PROPERTY = "history.expire.min-snapshots-to-keep"
MAX_REF_AGE_PROPERTY = "history.expire.max-ref-age-ms"
METADATA_KIND = "metadata_files"
STAT_THREADS = 8


@dataclass(frozen=True)
class RetentionPolicy:
    """Table-wide retention: branches and tags may override parts of it."""

    older_than_ms: int
    retain_last: int
    max_ref_age_ms: int | None
    # Expired as well, whatever their age or rank (Java's expireSnapshotId, Spark's
    # snapshot_ids); never the head of a branch or tag.
    snapshot_ids: frozenset[int] = frozenset()
    # Also remove the partition specs and schemas no retained snapshot uses (Spark's
    # clean_expired_metadata).
    clean_expired_metadata: bool = False


def _property(table: Table, identifier: str, name: str) -> int | None:
    value = table.metadata.properties.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(
            f"table {identifier}: property {name}={value!r} is not an integer"
        ) from None
    if number <= 0:
        raise ConfigError(f"table {identifier}: property {name}={value!r} must be positive")
    return number


def retention_policy(
    table: Table,
    identifier: str,
    older_than: str | None,
    retain_last: int | None,
    now_ms: int,
    snapshot_ids: Iterable[int] = (),
    clean_expired_metadata: bool = False,
) -> RetentionPolicy:
    """Flags over the table's ``history.expire.*`` properties over Iceberg's defaults."""
    if older_than is not None:
        cutoff = parse_cutoff(older_than, "--older-than", now_ms)
    else:
        max_age = _property(table, identifier, MAX_SNAPSHOT_AGE_PROPERTY)
        cutoff = now_ms - (max_age if max_age is not None else DEFAULT_MAX_SNAPSHOT_AGE_MS)
    if retain_last is not None and retain_last < 1:
        raise UsageError(f"--retain-last: must be at least 1, got {retain_last}")
    keep = retain_last or _property(table, identifier, MIN_SNAPSHOTS_PROPERTY)
    return RetentionPolicy(
        older_than_ms=cutoff,
        retain_last=keep or DEFAULT_MIN_SNAPSHOTS_TO_KEEP,
        max_ref_age_ms=_property(table, identifier, MAX_REF_AGE_PROPERTY),
        snapshot_ids=frozenset(snapshot_ids),
        clean_expired_metadata=clean_expired_metadata,
    )


@dataclass
class ExpiryPlan:
    """Snapshots and refs to remove, and the snapshots that stay."""

    expire: list[int]
    remove_refs: list[str]
    retain: set[int]
    remove_spec_ids: list[int] = field(default_factory=list)
    remove_schema_ids: list[int] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(
            self.expire or self.remove_refs or self.remove_spec_ids or self.remove_schema_ids
        )


def _ancestors(metadata: TableMetadata, snapshot_id: int) -> list[int]:
    chain, current = [], metadata.snapshot_by_id(snapshot_id)
    while current is not None:
        chain.append(current.snapshot_id)
        parent = current.parent_snapshot_id
        current = metadata.snapshot_by_id(parent) if parent is not None else None
    return chain


def plan_expiry(
    metadata: TableMetadata, policy: RetentionPolicy, now_ms: int, identifier: str
) -> ExpiryPlan:
    """Decide which snapshots and refs go, per the rules in this module's docstring.

    A snapshot of ``policy.snapshot_ids`` that the table does not hold, or that a branch or tag
    kept here points at, is a UsageError naming ``identifier``: nothing is expired.
    """
    timestamps = {s.snapshot_id: s.timestamp_ms for s in metadata.snapshots}
    remove_refs, retain = [], set()
    reachable_from_refs: set[int] = set()
    for name, ref in metadata.refs.items():
        if ref.snapshot_id not in timestamps:
            continue
        max_ref_age = ref.max_ref_age_ms or policy.max_ref_age_ms
        if (
            name != MAIN_BRANCH
            and max_ref_age
            and now_ms - timestamps[ref.snapshot_id] > max_ref_age
        ):
            remove_refs.append(name)
            continue
        if ref.snapshot_ref_type == SnapshotRefType.TAG:
            retain.add(ref.snapshot_id)
            reachable_from_refs.add(ref.snapshot_id)
            continue
        keep = ref.min_snapshots_to_keep or policy.retain_last
        cutoff = (
            now_ms - ref.max_snapshot_age_ms if ref.max_snapshot_age_ms else policy.older_than_ms
        )
        chain = _ancestors(metadata, ref.snapshot_id)
        reachable_from_refs.update(chain)
        for count, snapshot_id in enumerate(chain):
            if count < keep or timestamps[snapshot_id] >= cutoff:
                retain.add(snapshot_id)
            else:
                break
    for snapshot_id, timestamp in timestamps.items():
        if snapshot_id not in reachable_from_refs and timestamp >= policy.older_than_ms:
            retain.add(snapshot_id)
    if metadata.current_snapshot_id is not None:
        retain.add(metadata.current_snapshot_id)
    _check_explicit(metadata, policy.snapshot_ids, set(remove_refs), identifier)
    retain -= policy.snapshot_ids
    expire = sorted(set(timestamps) - retain)
    return ExpiryPlan(expire=expire, remove_refs=sorted(remove_refs), retain=retain)


def plan_metadata_cleanup(table: Table, plan: ExpiryPlan) -> None:
    """Add to ``plan`` the partition specs and schemas that nothing retained uses.

    Kept: the default spec, the current schema, every spec a manifest of a retained snapshot
    was written with and every retained snapshot's schema (as Java's cleanExpiredMetadata).
    """
    metadata = table.metadata
    specs_used, schemas_used = {metadata.default_spec_id}, {metadata.current_schema_id}
    for snapshot in metadata.snapshots:
        if snapshot.snapshot_id not in plan.retain:
            continue
        if snapshot.schema_id is not None:
            schemas_used.add(snapshot.schema_id)
        for manifest in snapshot_manifests(table.io, snapshot, metadata.format_version):
            specs_used.add(manifest.partition_spec_id)
    plan.remove_spec_ids = sorted({s.spec_id for s in metadata.partition_specs} - specs_used)
    plan.remove_schema_ids = sorted({s.schema_id for s in metadata.schemas} - schemas_used)


def _check_explicit(
    metadata: TableMetadata, snapshot_ids: frozenset[int], dropped_refs: set[str], identifier: str
) -> None:
    """Refuse explicit snapshot ids the table lacks, or that a kept branch or tag points at."""
    known = {s.snapshot_id for s in metadata.snapshots}
    heads = {
        ref.snapshot_id: name for name, ref in metadata.refs.items() if name not in dropped_refs
    }
    for snapshot_id in sorted(snapshot_ids):
        if snapshot_id not in known:
            problem = "is not a snapshot of the table"
        elif snapshot_id in heads:
            problem = f"is the head of {heads[snapshot_id]!r}: drop or move that ref first"
        else:
            continue
        raise UsageError(
            f"table {identifier}: snapshot_ids: {snapshot_id} {problem}", "snapshot_ids"
        )


# Paths listed in ``--json`` output at most; the counts beside them are always complete.
MAX_LISTED_PATHS = 1000


@dataclass
class DeletionReport:
    """Files deleted (or, in a dry run, that would be) by kind, and what was refused."""

    dry_run: bool = False
    by_kind: dict[str, list[FileRef]] = field(default_factory=lambda: defaultdict(list))
    outside_location: list[str] = field(default_factory=list)
    other_tables: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def files(self) -> int:
        """Files deleted (none in a dry run)."""
        return 0 if self.dry_run else sum(len(refs) for refs in self.by_kind.values())

    @property
    def bytes(self) -> int:
        """Their bytes, as far as the metadata or the listing told them."""
        return (
            0 if self.dry_run else sum(r.size or 0 for refs in self.by_kind.values() for r in refs)
        )

    @property
    def counts(self) -> dict[str, tuple[int, int]]:
        """Files and bytes deleted (in a dry run: that would be) by kind, in kind order."""
        return {
            kind: (len(refs), sum(r.size or 0 for r in refs))
            for kind, refs in sorted(self.by_kind.items())
        }

    def to_dict(self) -> dict[str, Any]:
        """What was deleted; in a dry run, what would be under the ``would_delete`` keys (and
        nothing under the ``deleted`` ones). Paths listed: at most MAX_LISTED_PATHS."""
        kinds = {
            kind: {"files": files, "bytes": size} for kind, (files, size) in self.counts.items()
        }
        paths = sorted(r.location for refs in self.by_kind.values() for r in refs)
        files = sum(k["files"] for k in kinds.values())
        size = sum(k["bytes"] for k in kinds.values())
        done = not self.dry_run
        return {
            "deleted": kinds if done else {},
            "files_deleted": files if done else 0,
            "bytes_deleted": size if done else 0,
            "deleted_paths": paths[:MAX_LISTED_PATHS] if done else [],
            "would_delete": {} if done else kinds,
            "would_delete_files": 0 if done else files,
            "would_delete_bytes": 0 if done else size,
            "would_delete_paths": [] if done else paths[:MAX_LISTED_PATHS],
            "refused_outside_table_location": len(self.outside_location),
            "refused_other_table_locations": len(self.other_tables),
            "failed": self.failed,
        }


def delete_unreachable(
    table: Table,
    candidates: list[FileRef],
    *,
    dry_run: bool,
    report: DeletionReport,
    fences: Fences | None = None,
) -> None:
    """Delete ``candidates`` under the table's location and outside ``fences``; report everything."""
    chosen: list[FileRef] = []
    for ref in candidates:
        if not is_within(ref.location, table.metadata.location):
            report.outside_location.append(ref.location)
        elif fences is not None and fences.owner(ref.location) is not None:
            report.other_tables.append(ref.location)
        else:
            chosen.append(ref)
    chosen = _with_sizes(table, chosen)
    failed = set() if dry_run else set(delete_files(table.io, [r.location for r in chosen]))
    report.failed.extend(sorted(failed))
    for ref in chosen:
        if ref.location not in failed:
            report.by_kind[ref.kind].append(ref)


def _with_sizes(table: Table, refs: list[FileRef]) -> list[FileRef]:
    """Fill in sizes the metadata does not record (manifest lists) from storage."""

    def sized(ref: FileRef) -> FileRef:
        if ref.size is not None:
            return ref
        try:
            return FileRef(ref.location, ref.kind, len(table.io.new_input(ref.location)))
        except OSError:
            return FileRef(ref.location, ref.kind, 0)

    with ThreadPoolExecutor(STAT_THREADS) as pool:
        return list(pool.map(sized, refs))


Reach = tuple[References, list[ManifestFile]]


def _unreachable(table: Table, before: Reach, after: Reach) -> list[FileRef]:
    """The files ``before`` reaches and ``after`` does not (each a :func:`snapshot_references`).

    A manifest ``after`` still reaches keeps every file it lists: only the manifests it no
    longer reaches are read for candidates, then those it reaches for the paths that keep a
    candidate. Memory holds the candidates, never every file of the table.
    """
    (before_refs, before_manifests), (after_refs, after_manifests) = before, after
    kept = after_refs.keys()
    gone = _not_in(before_refs.files.values(), kept)
    dropped = [m for m in before_manifests if _key(m.manifest_path) not in kept]
    candidates = {
        _key(ref.location): ref for ref in _not_in(manifest_file_refs(table, dropped), kept)
    }
    if candidates:
        for ref in manifest_file_refs(table, after_manifests):
            candidates.pop(_key(ref.location), None)
    return gone + list(candidates.values())


def _key(location: str) -> str | None:
    try:
        return location_key(location)
    except UnsafePathError:
        return None


def _not_in(refs: Iterable[FileRef], keys: set[str]) -> list[FileRef]:
    """``refs`` whose location keys are not in ``keys``; never one whose location cannot be
    compared safely."""
    found = []
    for ref in refs:
        key = _key(ref.location)
        if key is not None and key not in keys:
            found.append(ref)
    return found


class AssertRefsUnchanged(ValidatableTableRequirement):
    """Branches and tags are exactly as planned from (none added) and GC is still enabled.

    Not a REST requirement: only catalogs that validate requirements in this process get it.
    """

    type: Literal["assert-refs-unchanged"] = Field(default="assert-refs-unchanged")
    refs: dict[str, int]

    # pyiceberg's requirements name their check ``validate``, as pydantic's deprecated classmethod.
    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        if base_metadata is None:
            raise CommitFailedException("Requirement failed: current table metadata is missing")
        found = {name: ref.snapshot_id for name, ref in base_metadata.refs.items()}
        if found != self.refs:
            changed = sorted(
                n for n in found.keys() | self.refs.keys() if found.get(n) != self.refs.get(n)
            )
            raise CommitFailedException(
                f"Requirement failed: branches or tags changed concurrently: {', '.join(changed)}"
            )
        if not gc_enabled(base_metadata.properties):
            raise CommitFailedException(
                "Requirement failed: gc.enabled was set to false concurrently"
            )


def _checks_requirements_in_process(catalog: Catalog) -> bool:
    """Whether ``catalog`` calls ``validate`` on each requirement itself (not a REST server)."""
    return isinstance(catalog, MetastoreCatalog)


def _commit_expiry(table: Table, plan: ExpiryPlan) -> CommitTableResponse:
    metadata = table.metadata
    refs = {name: ref.snapshot_id for name, ref in metadata.refs.items()}
    requirements: list[TableRequirement] = [AssertTableUUID(uuid=metadata.table_uuid)]
    requirements += [
        AssertRefSnapshotId(ref=name, snapshot_id=sid) for name, sid in sorted(refs.items())
    ]
    if _checks_requirements_in_process(table.catalog):
        requirements.append(AssertRefsUnchanged(refs=refs))  # type: ignore[arg-type]
    updates: list[TableUpdate] = [
        RemoveSnapshotRefUpdate(ref_name=name) for name in plan.remove_refs
    ]
    if plan.expire:
        expired = set(plan.expire)
        # Before RemoveSnapshotsUpdate: pyiceberg's drops the statistics (not the partition
        # statistics) of the snapshots it removes, and each removal here must find its entry.
        updates += [
            RemovePartitionStatisticsUpdate(snapshot_id=s.snapshot_id)
            for s in metadata.partition_statistics
            if s.snapshot_id in expired
        ]
        updates += [
            RemoveStatisticsUpdate(snapshot_id=s.snapshot_id)
            for s in metadata.statistics
            if s.snapshot_id in expired
        ]
        updates.append(RemoveSnapshotsUpdate(snapshot_ids=plan.expire))
    if plan.remove_spec_ids or plan.remove_schema_ids:
        # A spec or schema made current meanwhile must not be removed.
        requirements.append(AssertDefaultSpecId(default_spec_id=metadata.default_spec_id))
        requirements.append(AssertCurrentSchemaId(current_schema_id=metadata.current_schema_id))
    if plan.remove_spec_ids:
        updates.append(RemovePartitionSpecsUpdate(spec_ids=plan.remove_spec_ids))
    if plan.remove_schema_ids:
        updates.append(RemoveSchemasUpdate(schema_ids=plan.remove_schema_ids))
    try:
        response = table.catalog.commit_table(table, tuple(requirements), tuple(updates))
    except OSError as exc:  # the catalog could not write the new metadata file: not committed
        refused = not_writable_error(".".join(table.name()), exc)
        if refused is None:
            raise
        raise refused from exc
    table.refresh()
    return response


def _dropped_refs(
    table: Table, planned_from: str, plan: ExpiryPlan, response: CommitTableResponse
) -> list[str] | None:
    """Refs the commit removed without planning to (created while the expiry was planned).

    The last entry of the committed metadata log is the metadata the catalog applied the commit
    to; when that is not the metadata the plan was made from, it is read and its refs compared.
    None when the catalog kept no log to tell.
    """
    log = response.metadata.metadata_log
    if not log:
        return None
    base_location = log[-1].metadata_file
    if base_location == planned_from:
        return []
    base = FromInputFile.table_metadata(table.io.new_input(base_location))
    kept = response.metadata.refs
    return sorted(name for name in base.refs if name not in kept and name not in plan.remove_refs)


def old_metadata_files(table: Table, *, after_commit: bool = False) -> list[FileRef]:
    """Metadata files no longer in the metadata log, per ``write.metadata.*`` properties.

    Only when ``write.metadata.delete-after-commit.enabled`` is true; only files older than
    the oldest version the log keeps (a newer one may belong to a commit in flight). With
    ``after_commit`` (a dry run of an expiry that would commit), the log is the one that commit
    would leave: the current file joins it and the oldest entries beyond
    ``write.metadata.previous-versions-max`` drop out.
    """
    if not _deletes_metadata_files(table):
        return []
    props = table.metadata.properties
    log = [(entry.metadata_file, entry.timestamp_ms) for entry in table.metadata.metadata_log]
    if after_commit:
        limit = property_as_int(
            props,
            TableProperties.METADATA_PREVIOUS_VERSIONS_MAX,
            TableProperties.METADATA_PREVIOUS_VERSIONS_MAX_DEFAULT,
        )
        log = [*log, (table.metadata_location, table.metadata.last_updated_ms)]
        log = log[-max(1, limit or 1) :]
    keep = {location_key(metadata_file) for metadata_file, _ in log}
    keep.add(location_key(table.metadata_location))
    oldest_kept = min([timestamp for _, timestamp in log] or [table.metadata.last_updated_ms])
    directory = table.metadata.location.rstrip("/") + "/metadata"
    return [
        FileRef(f.location, METADATA_KIND, f.size)
        for f in list_files(table.io, directory)
        if f.location.endswith(".metadata.json")
        and not f.symlink
        and location_key(f.location) not in keep
        and f.mtime_ms < oldest_kept
    ]


@dataclass
class ExpireResult:
    """What ``compactor expire`` did; ``to_dict`` is its ``--json`` output."""

    table: str
    dry_run: bool
    policy: RetentionPolicy
    plan: ExpiryPlan
    report: DeletionReport
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "older_than_ms": self.policy.older_than_ms,
            "retain_last": self.policy.retain_last,
            "snapshots_expired": len(self.plan.expire),
            "expired_snapshot_ids": self.plan.expire,
            "refs_removed": self.plan.remove_refs,
            "removed_spec_ids": self.plan.remove_spec_ids,
            "removed_schema_ids": self.plan.remove_schema_ids,
            "snapshots_retained": len(self.plan.retain),
            **self.report.to_dict(),
            "duration_ms": round(self.duration_s * 1000),
        }


def _deletes_metadata_files(table: Table) -> bool:
    props = table.metadata.properties
    return (
        props.get(TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED, "false").lower() == "true"
    )


def expire_snapshots(
    table: Table,
    identifier: str,
    policy: RetentionPolicy,
    *,
    catalog: Catalog | None = None,
    dry_run: bool = False,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> ExpireResult:
    """Expire per ``policy`` and delete what only expired snapshots reached.

    A conflicting commit is planned and tried again as the table's ``commit.retry.*``
    properties allow, as every commit of compactor is.

    ``catalog`` (default: the one the table was loaded from) is listed, when there is anything
    to expire or delete, for the other tables' locations: nothing under them is deleted.
    """
    started = time.monotonic()
    check_gc_enabled(table, identifier, EXPIRE)
    fences: Fences | None = None
    retry = RetryPolicy.for_table(table)
    started_retries = time.monotonic()
    for attempt in itertools.count():
        now_ms = int(clock() * 1000)
        planned_from = table.metadata_location
        plan = plan_expiry(table.metadata, policy, now_ms, identifier)
        if policy.clean_expired_metadata:
            plan_metadata_cleanup(table, plan)
        work = plan.changes
        if fences is None and (work or _deletes_metadata_files(table)):
            fences = other_tables_fences(catalog or table.catalog, table, identifier)
        before = snapshot_references(table)
        if dry_run or not work:
            retained = [s for s in table.metadata.snapshots if s.snapshot_id in plan.retain]
            after = snapshot_references(table, retained)
            break
        try:
            response = _commit_expiry(table, plan)
        except CommitFailedException as exc:
            elapsed_ms = (time.monotonic() - started_retries) * 1000
            if attempt >= retry.num_retries or elapsed_ms > retry.total_timeout_ms:
                raise CommitConflictError(
                    f"table {identifier}: expiry still conflicting after {attempt + 1} "
                    f"attempts: {exc}"
                ) from exc
            sleep(retry.wait_s(attempt))
            table.refresh()
            check_gc_enabled(table, identifier, EXPIRE)
            continue
        dropped = _dropped_refs(table, planned_from, plan, response)
        if dropped is None or dropped:
            what = (
                f"also dropped {', '.join(dropped)}, created while it ran"
                if dropped
                else "kept no metadata log to tell whether a branch or tag created meanwhile "
                "was dropped"
            )
            raise CommitConflictError(
                f"table {identifier}: the expiry committed but {what} "
                f"({type(table.catalog).__name__} cannot assert that none appears); no files "
                "were deleted"
            )
        after = snapshot_references(table)
        break
    report = DeletionReport(dry_run)
    delete_unreachable(
        table, _unreachable(table, before, after), dry_run=dry_run, report=report, fences=fences
    )
    would_commit = dry_run and plan.changes
    metadata_files = old_metadata_files(table, after_commit=would_commit)
    delete_unreachable(table, metadata_files, dry_run=dry_run, report=report, fences=fences)
    return ExpireResult(identifier, dry_run, policy, plan, report, time.monotonic() - started)
