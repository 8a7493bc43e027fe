"""The library API over a table you loaded with pyiceberg: plan, compact, expire, sweep,
rewrite deletes. The command line and the daemon call these, and nothing else, to run an action.

Each action takes its options as keyword arguments named as the fields of its model
(:class:`~compactor.options.CompactOptions`: ``target_file_size="256MiB"``,
``where="region = 'eu'"``, ``commit_every=4``, ...; :class:`~compactor.options.ExpireOptions`,
:class:`~compactor.options.OrphansOptions`, :class:`~compactor.options.RewriteDeletesOptions`)
or as one model instance (for compaction, one resolved :class:`~compactor.options.RewriteOptions`);
the table's own properties fill in the rest, as for the command line. The table's identifier is taken from the table. Every action
first installs compactor's fixes to pyiceberg (:func:`compactor.iceberg.pyiceberg_compat.install`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compactor import compaction
from compactor.commit.inflight import CommitInDoubt, LeaseHeldError, in_doubt_report
from compactor.compaction import Progress, RunResult, plan_compaction
from compactor.errors import UsageError
from compactor.execute.executors import Executor
from compactor.iceberg import pyiceberg_compat
from compactor.iceberg.catalogs import identifier_of
from compactor.maintain import delete_rewrite, expire, manifests, orphans
from compactor.options.compact import CompactOptions, RewriteOptions, resolve_options
from compactor.options.fields import Model, parse_options
from compactor.options.maintenance import (
    ExpireOptions,
    OrphansOptions,
    RewriteDeletesOptions,
    RewriteManifestsOptions,
)
from compactor.options.table_properties import (
    check_enabled,
    paused_actions,
    property_options,
    setting_sources,
    settings_list,
)
from compactor.planning.health import TableHealth, table_health
from compactor.planning.manifest_groups import ManifestStats, manifest_stats
from compactor.planning.planner import Plan
from compactor.quarantine import Quarantine, QuarantinedFile


def options_for(
    table: Table, options: RewriteOptions | None, overrides: dict[str, Any]
) -> RewriteOptions:
    """``options`` as given, or resolved from ``overrides`` over the table's ``compactor.compact.*``
    properties (:mod:`~compactor.options.table_properties`) and its other properties."""
    _one_of(options, overrides)
    if options is None:
        identifier, properties = identifier_of(table), table.metadata.properties
        set_by_table = property_options(identifier, properties, "compact", CompactOptions)
        return resolve_options(identifier, properties, **{**set_by_table, **overrides})
    return options


def model_for(
    table: Table, action: str, model: type[Model], options: Model | None, overrides: dict[str, Any]
) -> Model:
    """``options`` as given (a job section is one, its values under the table's
    ``compactor.<action>.*`` properties), or the model of the option keywords over them."""
    _one_of(options, overrides)
    identifier, properties = identifier_of(table), table.metadata.properties
    set_by_table = property_options(identifier, properties, action, model)
    if options is None:
        return parse_options(model, {**set_by_table, **overrides})
    return options.model_copy(update=set_by_table)


def _one_of(options: object, overrides: dict[str, Any]) -> None:
    if options is not None and overrides:
        raise UsageError(
            f"give options or option keywords ({', '.join(sorted(overrides))}), not both"
        )


def plan(table: Table, options: RewriteOptions | None = None, **option_overrides: Any) -> Plan:
    """What :func:`compact` would rewrite now: groups, input files and bytes. Writes nothing."""
    pyiceberg_compat.install()
    resolved = options_for(table, options, option_overrides)
    return plan_compaction(table, resolved.plan)[0]


def compact(
    table: Table,
    options: RewriteOptions | None = None,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    executor: Executor | None = None,
    grown_before: Collection[frozenset[str]] = (),
    **option_overrides: Any,
) -> RunResult:
    """Compact ``table``: rewrite its small files into target-size ones, commit ``replace``.

    Exactly what ``compactor run`` and the daemon do: one run per table at a time (when another
    live run holds the table, nothing is done and ``result.backed_off`` says why, with the plan
    of what would have been rewritten), partial progress with ``commit_every``, and no file of
    an uncommitted group left behind. ``executor`` runs the rewrite tasks (default: the one the
    ``executor`` option names; threads unless told otherwise); setting ``stop`` ends the run
    early, committing the groups already finished. Groups whose inputs are in ``grown_before``
    (an earlier result's ``grown_inputs``) are not rewritten again. ``result.to_dict()`` is the
    ``--json`` output of ``compactor run``.
    """
    pyiceberg_compat.install()
    check_enabled(identifier_of(table), table.metadata.properties, "compact")
    resolved = options_for(table, options, option_overrides)
    try:
        return compaction.compact_table(
            table,
            resolved,
            dry_run=dry_run,
            progress=progress,
            stop=stop,
            executor=executor,
            grown_before=grown_before,
        )
    except LeaseHeldError as exc:
        return compaction.backed_off(table, resolved, str(exc))


@dataclass
class Inspection:
    """How fragmented a table is (``compactor inspect``): its files against the target, the
    unreadable files the last compaction skipped, the files its quarantine leaves out of
    compaction, and commits that may still land."""

    health: TableHealth
    unreadable_files: list[str]
    commits_in_doubt: list[CommitInDoubt]
    warnings: tuple[str, ...] = ()
    manifests: ManifestStats | None = None  # the current manifest list's manifests
    # Compaction's options not at their default: option -> (value, where it came from).
    settings: dict[str, tuple[Any, str]] = field(default_factory=dict)
    paused: list[str] = field(default_factory=list)  # actions the table's properties pause
    quarantined_files: list[QuarantinedFile] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` output of ``compactor inspect``."""
        return {
            **self.health.to_dict(),
            **(self.manifests.to_dict() if self.manifests is not None else {}),
            "unreadable_files": self.unreadable_files,
            "quarantined_files": [f.to_dict() for f in self.quarantined_files],
            "commits_in_doubt": [c.to_dict() for c in self.commits_in_doubt],
            "settings": settings_list(self.settings),
            "paused": self.paused,
        }


def inspect(
    table: Table, options: RewriteOptions | None = None, **option_overrides: Any
) -> Inspection:
    """The table's files against the target a compaction would use (options as for
    :func:`compact`; ``target_file_size`` is the one that matters). Reads manifests, and asks
    storage about each quarantined file only."""
    pyiceberg_compat.install()
    resolved = options_for(table, options, option_overrides)
    health = table_health(
        table,
        identifier_of(table),
        resolved.plan.target_file_size,
        resolved.plan.min_input_files,
    )
    identifier, properties = identifier_of(table), table.metadata.properties
    return Inspection(
        health,
        compaction.last_unreadable_files(table),
        in_doubt_report(table),
        resolved.warnings,
        manifest_stats(table),
        setting_sources(identifier, properties, "compact", CompactOptions, option_overrides),
        paused_actions(identifier, properties),
        Quarantine.load(table).files,
    )


def expire_snapshots(
    table: Table,
    options: ExpireOptions | None = None,
    *,
    dry_run: bool = False,
    catalog: Catalog | None = None,
    snapshot_ids: Iterable[int] = (),
    **option_overrides: Any,
) -> expire.ExpireResult:
    """Expire old snapshots, then delete the files only they reached (``compactor expire``).

    ``older_than`` (``"5d"`` or an ISO timestamp) and ``retain_last`` default to the table's
    ``history.expire.*`` properties; ``snapshot_ids`` are expired as well, whatever their age
    (never the head of a branch or tag); ``clean_expired_metadata`` also removes the partition
    specs and schemas no retained snapshot uses; ``catalog`` (default: the table's) is listed so
    that no other table's files are deleted.
    """
    pyiceberg_compat.install()
    check_enabled(identifier_of(table), table.metadata.properties, "expire")
    given = model_for(table, "expire", ExpireOptions, options, option_overrides)
    identifier = identifier_of(table)
    now_ms = int(time.time() * 1000)
    policy = expire.retention_policy(
        table,
        identifier,
        given.older_than,
        given.retain_last,
        now_ms,
        snapshot_ids,
        given.clean_expired_metadata,
    )
    return expire.expire_snapshots(table, identifier, policy, catalog=catalog, dry_run=dry_run)


def remove_orphans(
    table: Table,
    options: OrphansOptions | None = None,
    *,
    dry_run: bool = False,
    catalog: Catalog | None = None,
    location: str | None = None,
    **option_overrides: Any,
) -> orphans.OrphanResult:
    """Delete files under the table's location that nothing references (``compactor orphans``).

    Only files older than ``older_than`` (a duration or an ISO timestamp; default three days;
    at least ``"1d"`` unless ``allow_short_older_than``) are deleted; only under ``location``
    when given (a sub-path of the table's location, in full or relative to it, e.g.
    ``"data/region=eu"``).
    """
    pyiceberg_compat.install()
    check_enabled(identifier_of(table), table.metadata.properties, "orphans")
    given = model_for(table, "orphans", OrphansOptions, options, option_overrides)
    now_ms = int(time.time() * 1000)
    cutoff = orphans.orphan_cutoff(
        given.older_than, now_ms, allow_short=given.allow_short_older_than
    )
    return orphans.remove_orphans(
        table,
        identifier_of(table),
        cutoff,
        catalog=catalog,
        dry_run=dry_run,
        allow_short_older_than=given.allow_short_older_than,
        location=location,
    )


def rewrite_deletes(
    table: Table,
    options: RewriteDeletesOptions | None = None,
    *,
    dry_run: bool = False,
    **option_overrides: Any,
) -> delete_rewrite.DeleteRewriteResult:
    """Convert equality deletes into position deletes (reading only key columns), then compact
    position-delete files per partition, dropping rows and files that apply to no live data
    file (``compactor rewrite-deletes``; Java's ``rewrite_position_delete_files``)."""
    pyiceberg_compat.install()
    check_enabled(identifier_of(table), table.metadata.properties, "rewrite-deletes")
    given = model_for(table, "rewrite-deletes", RewriteDeletesOptions, options, option_overrides)
    return delete_rewrite.rewrite_position_deletes(
        table,
        identifier_of(table),
        target_file_size=given.target_file_size,
        where=given.where,
        dry_run=dry_run,
        convert_equality_deletes=given.convert_equality_deletes,
        branch=given.branch,
        memory_limit=given.memory_limit,
    )


def rewrite_manifests(
    table: Table,
    options: RewriteManifestsOptions | None = None,
    *,
    dry_run: bool = False,
    progress: manifests.ManifestProgress | None = None,
    **option_overrides: Any,
) -> manifests.ManifestRewriteResult:
    """Rewrite the current snapshot's manifests clustered by partition, each of about the
    table's ``commit.manifest.target-size-bytes`` (``compactor rewrite-manifests``; Spark's
    ``rewrite_manifests``): one ``replace`` snapshot that adds and removes no file. Groups of
    manifests already in order are left alone; like ``compact``, it does nothing while another
    live run holds the table, and ``backed_off`` says why."""
    pyiceberg_compat.install()
    check_enabled(identifier_of(table), table.metadata.properties, "rewrite-manifests")
    given = model_for(
        table, "rewrite-manifests", RewriteManifestsOptions, options, option_overrides
    )
    return manifests.rewrite_manifests(
        table,
        identifier_of(table),
        spec_id=given.spec_id,
        target_size=given.target_manifest_size,
        dry_run=dry_run,
        progress=progress,
    )
