"""Executors run rewrite tasks: threads of this process (the default) or a Ray cluster."""

from __future__ import annotations

from compactor.errors import UsageError
from compactor.execute.executors import Executor, ThreadExecutor
from compactor.options.compact import ExecutionOptions
from compactor.options.environment import default_parallelism


def make_executor(options: ExecutionOptions) -> Executor:
    """The executor ``options.executor`` names: ``threads`` or ``ray`` (needs ``compactor[ray]``)."""
    if options.executor == "ray":
        try:
            from compactor.execute.ray_executor import RayExecutor
        except ImportError:
            raise UsageError(
                "executor 'ray' needs the ray extra: pip install 'compactor[ray]'", "executor"
            ) from None
        return RayExecutor(address=options.ray_address, parallelism=options.parallelism)
    if options.executor != "threads":
        raise UsageError(f"executor {options.executor!r}: unknown (threads or ray)", "executor")
    return ThreadExecutor(options.parallelism or default_parallelism())
