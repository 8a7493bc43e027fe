"""compactor: keep Apache Iceberg tables fast — compact small files, expire snapshots, sweep orphans.

The library API (see the README's "Library" section)::

    import compactor
    result = compactor.compact(table, target_file_size="256MiB")

- :func:`inspect`, :func:`plan`, :func:`compact`, :func:`expire_snapshots`,
  :func:`remove_orphans`, :func:`rewrite_deletes` and :func:`rewrite_manifests` work on a table loaded with pyiceberg;
  options are keyword arguments named as the fields of the action's model
  (:class:`CompactOptions`, :class:`ExpireOptions`, :class:`OrphansOptions`,
  :class:`RewriteDeletesOptions`, :class:`RewriteManifestsOptions`) or one instance of it (a resolved :class:`RewriteOptions`
  for compaction).
- :class:`RewriteTask`, :class:`TaskResult` and :func:`run_task` are the seam for custom
  executors: a task is plain data (``to_json``/``from_json``) that :func:`run_task` rewrites
  in any process; :class:`Executor` is what ``compact(executor=...)`` accepts.
- Results: :class:`Inspection` (``inspect``), :class:`RunResult` (``compact``; ``backed_off``
  when another run holds the table), :class:`DeleteRewriteResult`, :class:`ManifestRewriteResult`, :class:`ExpireResult`, :class:`OrphanResult`; each has
  ``to_dict()``, the command's ``--json`` output.
- Errors derive from :class:`CompactorError`; :class:`UsageError` for bad options.

Names are imported on first use: ``import compactor`` alone reads no pyiceberg configuration.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from compactor.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    CompactorError,
    ConfigError,
    DataFileError,
    GcDisabledError,
    UnsupportedTableError,
    UsageError,
)

__version__ = version("compactor")

_LAZY = {
    "plan": "compactor.api",
    "compact": "compactor.api",
    "inspect": "compactor.api",
    "Inspection": "compactor.api",
    "CommitInDoubt": "compactor.commit.inflight",
    "expire_snapshots": "compactor.api",
    "remove_orphans": "compactor.api",
    "rewrite_deletes": "compactor.api",
    "rewrite_manifests": "compactor.api",
    "RewriteOptions": "compactor.options",
    "CompactOptions": "compactor.options",
    "ExpireOptions": "compactor.options",
    "OrphansOptions": "compactor.options",
    "RewriteDeletesOptions": "compactor.options",
    "RewriteManifestsOptions": "compactor.options",
    "resolve_options": "compactor.options",
    "Plan": "compactor.planning.planner",
    "RunResult": "compactor.compaction",
    "DeleteRewriteResult": "compactor.maintain.delete_rewrite",
    "ManifestRewriteResult": "compactor.maintain.manifests",
    "ExpireResult": "compactor.maintain.expire",
    "OrphanResult": "compactor.maintain.orphans",
    "PendingCommit": "compactor.commit.inflight",
    "RewriteTask": "compactor.planning.tasks",
    "TaskInput": "compactor.planning.planner",
    "TaskResult": "compactor.planning.tasks",
    "TaskCancelled": "compactor.rewrite.task_runner",
    "CancelToken": "compactor.rewrite.task_runner",
    "run_task": "compactor.rewrite.task_runner",
    "Executor": "compactor.execute.executors",
    "ThreadExecutor": "compactor.execute.executors",
    "LeaseHeldError": "compactor.commit.inflight",
}

__all__ = [
    "CancelToken",
    "CommitInDoubt",
    "CommitConflictError",
    "CommitStateUnknownError",
    "CompactOptions",
    "CompactorError",
    "ConfigError",
    "DataFileError",
    "DeleteRewriteResult",
    "Executor",
    "ExpireOptions",
    "ExpireResult",
    "GcDisabledError",
    "Inspection",
    "LeaseHeldError",
    "ManifestRewriteResult",
    "OrphanResult",
    "OrphansOptions",
    "PendingCommit",
    "Plan",
    "RewriteDeletesOptions",
    "RewriteManifestsOptions",
    "RewriteOptions",
    "RewriteTask",
    "RunResult",
    "TaskCancelled",
    "TaskInput",
    "TaskResult",
    "ThreadExecutor",
    "UnsupportedTableError",
    "UsageError",
    "__version__",
    "compact",
    "expire_snapshots",
    "inspect",
    "plan",
    "remove_orphans",
    "resolve_options",
    "rewrite_deletes",
    "rewrite_manifests",
    "run_task",
]

if TYPE_CHECKING:
    from compactor.api import (
        Inspection,
        compact,
        expire_snapshots,
        inspect,
        plan,
        remove_orphans,
        rewrite_deletes,
        rewrite_manifests,
    )
    from compactor.commit.inflight import CommitInDoubt, LeaseHeldError, PendingCommit
    from compactor.compaction import RunResult
    from compactor.execute.executors import Executor, ThreadExecutor
    from compactor.maintain.delete_rewrite import DeleteRewriteResult
    from compactor.maintain.expire import ExpireResult
    from compactor.maintain.manifests import ManifestRewriteResult
    from compactor.maintain.orphans import OrphanResult
    from compactor.options import (
        CompactOptions,
        ExpireOptions,
        OrphansOptions,
        RewriteDeletesOptions,
        RewriteManifestsOptions,
        RewriteOptions,
        resolve_options,
    )
    from compactor.planning.planner import Plan, TaskInput
    from compactor.planning.tasks import RewriteTask, TaskResult
    from compactor.rewrite.task_runner import CancelToken, TaskCancelled, run_task


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'compactor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
