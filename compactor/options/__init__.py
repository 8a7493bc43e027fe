"""Options of every action, declared once per action and resolved with the table's properties.

- :mod:`~compactor.options.defaults`: every default and bound;
- :mod:`~compactor.options.compact`: a compaction's options (:class:`CompactOptions`) and their
  resolution into the planner's, the executor's and the committer's parts
  (:func:`resolve_options` -> :class:`RewriteOptions`);
- :mod:`~compactor.options.maintenance`: expiry, orphan removal, delete and manifest
  rewriting;
- :mod:`~compactor.options.fields`: the checked field types the models share.
"""

from compactor.options.compact import (
    CommitOptions,
    CompactOptions,
    ExecutionOptions,
    PlanOptions,
    RewriteOptions,
    resolve_options,
)
from compactor.options.maintenance import (
    ExpireOptions,
    OrphansOptions,
    RewriteDeletesOptions,
    RewriteManifestsOptions,
)

__all__ = [
    "CommitOptions",
    "CompactOptions",
    "ExecutionOptions",
    "ExpireOptions",
    "OrphansOptions",
    "PlanOptions",
    "RewriteDeletesOptions",
    "RewriteManifestsOptions",
    "RewriteOptions",
    "resolve_options",
]
