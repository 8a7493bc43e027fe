"""The library API over a table you loaded with pyiceberg: plan, compact, expire, sweep.

Options are keyword arguments named as in :func:`compactor.options.resolve_options`
(``target_file_size="256MiB"``, ``where="region = 'eu'"``, ``commit_every=4``, ...) or one
resolved :class:`~compactor.options.RewriteOptions`; the table's own properties fill in the
rest, as for the command line. The table's identifier is taken from the table. Every action
first installs compactor's fixes to pyiceberg (:func:`compactor.iceberg.pyiceberg_compat.install`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compactor import compaction
from compactor.commit.inflight import LeaseHeldError
from compactor.compaction import Progress, RunResult
from compactor.errors import UsageError
from compactor.execute.executors import Executor
from compactor.iceberg import pyiceberg_compat
from compactor.iceberg.catalogs import identifier_of
from compactor.maintain import delete_rewrite, expire, orphans
from compactor.options import RewriteOptions, resolve_options
from compactor.planning.planner import Plan, plan_rewrite


def options_for(
    table: Table, options: RewriteOptions | None, overrides: dict[str, Any]
) -> RewriteOptions:
    """``options`` as given, or resolved from ``overrides`` over the table's properties."""
    if options is None:
        return resolve_options(identifier_of(table), table.metadata.properties, **overrides)
    if overrides:
        raise UsageError(
            f"give options or option keywords ({', '.join(sorted(overrides))}), not both"
        )
    return options


def plan(table: Table, options: RewriteOptions | None = None, **option_overrides: Any) -> Plan:
    """What :func:`compact` would rewrite now: groups, input files and bytes. Writes nothing."""
    pyiceberg_compat.install()
    identifier = identifier_of(table)
    return plan_rewrite(table, identifier, options_for(table, options, option_overrides))


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


def expire_snapshots(
    table: Table,
    *,
    older_than: str | None = None,
    retain_last: int | None = None,
    dry_run: bool = False,
    catalog: Catalog | None = None,
    snapshot_ids: Iterable[int] = (),
    clean_expired_metadata: bool = False,
) -> expire.ExpireResult:
    """Expire old snapshots, then delete the files only they reached (``compactor expire``).

    ``older_than`` (``"5d"`` or an ISO timestamp) and ``retain_last`` default to the table's
    ``history.expire.*`` properties; ``snapshot_ids`` are expired as well, whatever their age
    (never the head of a branch or tag); ``clean_expired_metadata`` also removes the partition
    specs and schemas no retained snapshot uses; ``catalog`` (default: the table's) is listed so
    that no other table's files are deleted.
    """
    pyiceberg_compat.install()
    identifier = identifier_of(table)
    now_ms = int(time.time() * 1000)
    policy = expire.retention_policy(
        table, identifier, older_than, retain_last, now_ms, snapshot_ids, clean_expired_metadata
    )
    return expire.expire_snapshots(table, identifier, policy, catalog=catalog, dry_run=dry_run)


def remove_orphans(
    table: Table,
    *,
    older_than: str | None = None,
    allow_short_older_than: bool = False,
    dry_run: bool = False,
    catalog: Catalog | None = None,
    location: str | None = None,
) -> orphans.OrphanResult:
    """Delete files under the table's location that nothing references (``compactor orphans``).

    Only files older than ``older_than`` (a duration or an ISO timestamp; default three days;
    at least ``"1d"`` unless ``allow_short_older_than``) are deleted; only under ``location``
    when given (a sub-path of the table's location, in full or relative to it, e.g.
    ``"data/region=eu"``).
    """
    pyiceberg_compat.install()
    now_ms = int(time.time() * 1000)
    cutoff = orphans.orphan_cutoff(older_than, now_ms, allow_short=allow_short_older_than)
    return orphans.remove_orphans(
        table,
        identifier_of(table),
        cutoff,
        catalog=catalog,
        dry_run=dry_run,
        allow_short_older_than=allow_short_older_than,
        location=location,
    )


def rewrite_deletes(
    table: Table,
    *,
    target_file_size: int | str | None = None,
    where: str | None = None,
    dry_run: bool = False,
) -> delete_rewrite.DeleteRewriteResult:
    """Compact position-delete files per partition, dropping rows and files that apply to no
    live data file (``compactor rewrite-deletes``; Java's ``rewrite_position_delete_files``)."""
    pyiceberg_compat.install()
    return delete_rewrite.rewrite_position_deletes(
        table, identifier_of(table), target_file_size=target_file_size, where=where, dry_run=dry_run
    )
