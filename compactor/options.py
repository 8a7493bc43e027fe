"""Every default in one place, and how flags and Iceberg table properties combine into options.

Precedence: an option given (a flag, a job file key, a keyword argument), then the table's
Iceberg property, then the default below. Errors name options as the library spells them
(``target_file_size``); the command line shows its flags instead.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from compactor.durations import DAY_MS
from compactor.errors import ConfigError, UsageError, first_line
from compactor.sizes import format_size, format_size_exact, parse_size

MiB = 2**20
GiB = 2**30

# Output file size: S3 Tables allows 64 MB to 512 MB; Iceberg's own default is 512 MiB.
DEFAULT_TARGET_FILE_SIZE = 512 * MiB
MIN_TARGET_FILE_SIZE = 64 * 10**6
MAX_TARGET_FILE_SIZE = 512 * MiB
# A data file is a candidate when under 75% or over 180% of the target (as in Iceberg Java).
MIN_FILE_SIZE_RATIO = 0.75
MAX_FILE_SIZE_RATIO = 1.80
# The order groups are rewritten (and, with partial progress, committed) in: Spark's
# rewrite-job-order values, and compactor's default, most files first.
RewriteJobOrder = Literal["most-fragmented", "bytes-asc", "bytes-desc", "files-asc", "files-desc"]
REWRITE_JOB_ORDERS = get_args(RewriteJobOrder)
DEFAULT_REWRITE_JOB_ORDER: RewriteJobOrder = "most-fragmented"
DEFAULT_MIN_INPUT_FILES = 5
# How a group's rows are ordered: as read (bin-pack), sorted, or z-ordered (Spark's strategies).
Strategy = Literal["binpack", "sort", "zorder"]
STRATEGIES = get_args(Strategy)
DEFAULT_STRATEGY: Strategy = "binpack"
# Files with many deletes are candidates even when right-sized (as Spark's rewrite_data_files):
# at least N delete files (off unless given), or deleted rows >= this share of the file's rows.
DEFAULT_DELETE_FILE_THRESHOLD: int | None = None
DEFAULT_DELETE_RATIO_THRESHOLD = 0.3
DEFAULT_MAX_GROUP_SIZE = 100 * GiB
DEFAULT_ROW_GROUP_SIZE = 128 * MiB
# A group's rewrite is not committed when its output is more than this share larger than its
# input, unless it applies deletes, moves rows to another spec, or divides the file count by at
# least MIN_FILE_REDUCTION_FOR_GROWTH (many small files into few are worth a few more bytes).
MAX_OUTPUT_GROWTH = 0.02
MIN_FILE_REDUCTION_FOR_GROWTH = 2
# Memory: a run aims to keep its process's resident memory under --memory-limit. Past a fixed
# allowance for the interpreter and libraries, each worker costs a fixed overhead plus three
# equal shares (ClickHouse's S3 insert guide: buffer ~ limit / (3 x workers)): rows read ahead
# of the writer, the row group being filled (an in-memory budget: at most the table's
# row-group size), and room for decoding and encoding.
DEFAULT_MEMORY_LIMIT = 384 * MiB
PROCESS_ALLOWANCE = 160 * MiB
# A worker's cost beyond its shares: the Parquet reader's and writer's per-column state and
# its threads' heaps. Measured 85-105 MB on TPC-DS store_sales (23 columns); narrower tables
# use less.
WORKER_OVERHEAD = 96 * MiB
MIN_SHARE = 16 * MiB
# The least one worker gets; fewer workers run when the limit allows no more.
MIN_WORKER_MEMORY = WORKER_OVERHEAD + 3 * MIN_SHARE
MIN_MEMORY_LIMIT = PROCESS_ALLOWANCE + MIN_WORKER_MEMORY
# Decoded input bytes each worker may hold ahead of the writer, when no limit is computed.
DEFAULT_READ_AHEAD = 64 * MiB
# Files at least this large are streamed batch by batch instead of being read ahead whole.
STREAM_FILE_THRESHOLD = 16 * MiB
# A container's CPU limit under cgroup v2: "max 100000" or "<quota> <period>".
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
# Partial progress: 0 = one commit at the end (all or nothing); otherwise commit every N groups,
# in at most DEFAULT_MAX_COMMITS commits (as Iceberg's partial-progress.max-commits).
DEFAULT_COMMIT_EVERY = 0
DEFAULT_MAX_COMMITS = 10
# A run's lease on a table lasts this long without a heartbeat (heartbeats come every third).
DEFAULT_LEASE_TTL_S = 600.0
# Where groups are rewritten: threads of this process, or tasks on a Ray cluster (compactor[ray]).
Executor = Literal["threads", "ray"]
EXECUTORS = get_args(Executor)
DEFAULT_EXECUTOR: Executor = "threads"
# Orphan removal never deletes files younger than this unless explicitly allowed
# (--allow-short-older-than): a commit or a compaction run in flight may still need them.
# Spark's remove_orphan_files defaults to 3 days, Trino refuses less than 7 days by default.
MIN_ORPHAN_AGE_MS = DAY_MS

TARGET_FILE_SIZE_PROPERTY = "write.target-file-size-bytes"
ROW_GROUP_SIZE_PROPERTY = "write.parquet.row-group-size-bytes"

SNAPSHOT_PROPERTY_TOOL = "compactor.version"
# The run that committed a snapshot, and what it did when it was not a compaction.
SNAPSHOT_PROPERTY_RUN_ID = "compactor.run-id"
SNAPSHOT_PROPERTY_ACTION = "compactor.action"

PYICEBERG_CONFIG_FILE = ".pyiceberg.yaml"
FILTER_EXAMPLE = "region = 'eu' and event_id >= 100"


def default_parallelism() -> int:
    """Groups rewritten at once: one per core this process may use.

    That is the CPU affinity, capped by a cgroup v2 CPU quota (a container's CPU limit), not the
    machine's core count.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores)


@dataclass(frozen=True)
class RewriteOptions:
    """Options of one compaction run, after flags and table properties are resolved."""

    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    min_input_files: int = DEFAULT_MIN_INPUT_FILES
    delete_file_threshold: int | None = DEFAULT_DELETE_FILE_THRESHOLD
    delete_ratio_threshold: float = DEFAULT_DELETE_RATIO_THRESHOLD
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE
    read_ahead: int = DEFAULT_READ_AHEAD
    parallelism: int | None = 1  # None: as many as the Ray cluster schedules
    where: str | None = None
    commit_every: int = DEFAULT_COMMIT_EVERY
    max_commits: int = DEFAULT_MAX_COMMITS
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    executor: str = DEFAULT_EXECUTOR
    ray_address: str | None = None
    bulk_read: bool = True
    memory_limit: int = DEFAULT_MEMORY_LIMIT
    # Files below min_file_size or above max_file_size are candidates (Spark's names); None:
    # MIN_FILE_SIZE_RATIO and MAX_FILE_SIZE_RATIO of the target.
    min_file_size_given: int | None = None
    max_file_size_given: int | None = None
    rewrite_all: bool = False
    max_files_to_rewrite: int | None = None
    rewrite_job_order: str = DEFAULT_REWRITE_JOB_ORDER
    max_failed_commits: int | None = None  # None: max_commits (Spark's default)
    strategy: str = DEFAULT_STRATEGY
    sort_order: str | None = None  # None with strategy sort: the table's sort order
    zorder: str | None = None
    branch: str = "main"  # the branch planned from and committed to
    # Files of other partition specs are rewritten into this one (None: each keeps its spec).
    output_spec_id: int | None = None
    warnings: tuple[str, ...] = ()  # one line each, e.g. a table property replaced by a bound

    @property
    def min_file_size(self) -> int:
        """Files below this size are candidates."""
        if self.min_file_size_given is not None:
            return self.min_file_size_given
        return int(self.target_file_size * MIN_FILE_SIZE_RATIO)

    @property
    def max_file_size(self) -> int:
        """Files above this size are candidates (they are split)."""
        if self.max_file_size_given is not None:
            return self.max_file_size_given
        return int(self.target_file_size * MAX_FILE_SIZE_RATIO)

    @property
    def partial_progress(self) -> bool:
        """Commit in batches, and let a failed group fail alone."""
        return self.commit_every > 0

    @property
    def failed_commits_allowed(self) -> int:
        """With partial progress, the run stops after more failed commits than this."""
        if self.max_failed_commits is None:
            return self.max_commits
        return self.max_failed_commits

    def commit_batch_size(self, groups: int) -> int:
        """Groups per commit: all at once, or every N within the commit limit."""
        if not self.partial_progress:
            return max(groups, 1)
        return max(self.commit_every, -(-groups // self.max_commits))


def _int_property(properties: dict[str, str], name: str, table: str) -> int | None:
    if name not in properties:
        return None
    try:
        return int(properties[name])
    except ValueError:
        raise ConfigError(
            f"table {table}: property {name}={properties[name]!r} is not an integer"
        ) from None


def pyiceberg_config_file() -> Path | None:
    """The configuration file pyiceberg reads: first of $PYICEBERG_HOME, ~, the current directory."""
    for directory in (os.environ.get("PYICEBERG_HOME"), os.path.expanduser("~"), os.getcwd()):
        if directory and (Path(directory) / PYICEBERG_CONFIG_FILE).is_file():
            return Path(directory) / PYICEBERG_CONFIG_FILE
    return None


def check_pyiceberg_config() -> None:
    """Fail with one line naming the file and line when pyiceberg's configuration is unreadable.

    pyiceberg reads it when its catalog module is first imported and fails there with a long
    parser trace, so this runs first. Imports only pyiceberg's light config module.
    """
    from pyiceberg.utils.config import Config

    try:
        Config()
    except Exception as exc:  # strictyaml, OSError, or ValueError for clashing variables
        problem = getattr(exc, "problem", None) or first_line(exc)
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        source = pyiceberg_config_file() or "PYICEBERG_* environment variables"
        raise ConfigError(f"{source}: {problem}{where}") from exc


def check_filter_syntax(where: str) -> None:
    """Fail with one line when ``where`` is not a filter expression pyiceberg can parse.

    Columns are checked later, against the table's schema, by the planner.
    """
    from pyiceberg.expressions.parser import parse

    try:
        parse(where)
    except Exception as exc:  # pyparsing's ParseException, or a literal that does not convert
        column = getattr(exc, "col", None)
        at = f" at column {column}" if isinstance(column, int) and column > 1 else ""
        raise UsageError(
            f'where {where!r}: not a valid filter{at} (example: "{FILTER_EXAMPLE}")', "where"
        ) from None


class _OptionValueError(ValueError):
    """A shared parser's UsageError, carried through pydantic so callers get it back whole."""

    def __init__(self, usage: UsageError, *, names_itself: bool = False) -> None:
        # A field's error drops its "option: " prefix: pydantic reports where the value was.
        super().__init__(str(usage) if names_itself else str(usage).split(": ", 1)[-1])
        self.usage = usage


def checked(check: Callable[[Any, str], object]) -> AfterValidator:
    """A pydantic validator running ``check(value, option_name)``, a parser raising UsageError."""

    def run(value: Any, info: ValidationInfo) -> Any:
        try:
            check(value, info.field_name or "value")
        except UsageError as exc:
            raise _OptionValueError(exc) from None
        return value

    return AfterValidator(run)


def _at_least(minimum: int, meaning: str = "") -> AfterValidator:
    def check(value: int, option: str) -> None:
        if value < minimum:
            raise UsageError(
                f"{option}: must be {meaning or f'at least {minimum}'}, got {value}", option
            )

    return checked(check)


def _ratio(value: float, option: str) -> None:
    if not 0 < value <= 1:
        raise UsageError(f"{option}: must be above 0 and at most 1, got {value}", option)


Size = Annotated[str, checked(parse_size)]
Filter = Annotated[str, checked(lambda value, _: check_filter_syntax(value))]


def _sort_order_syntax(value: str, option: str) -> None:
    from compactor.planning.sort_order import parse_sort_order

    parse_sort_order(value, option)


def _columns_syntax(value: str, option: str) -> None:
    from compactor.planning.sort_order import parse_columns

    parse_columns(value, option)


def _branch_name(value: str, option: str) -> None:
    if not value.strip():
        raise UsageError(f"{option}: must name a branch, got {value!r}", option)


class CompactOptions(BaseModel):
    """The options of a compaction one can give — by keyword, flag or job-file key; None = not given.

    Declared once here: the library, the command line and job files all validate with it.
    :func:`resolve_options` combines them with the table's properties into RewriteOptions.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_file_size: Size | None = None
    allow_small_target: bool = False
    min_input_files: Annotated[int, _at_least(1)] = DEFAULT_MIN_INPUT_FILES
    delete_file_threshold: Annotated[int, _at_least(1)] | None = DEFAULT_DELETE_FILE_THRESHOLD
    delete_ratio_threshold: Annotated[float, checked(_ratio)] = DEFAULT_DELETE_RATIO_THRESHOLD
    max_group_size: Size | None = None
    parallelism: Annotated[int, _at_least(1)] | None = None
    where: Filter | None = None
    commit_every: Annotated[int, _at_least(0, "0 (off) or more")] = DEFAULT_COMMIT_EVERY
    max_commits: Annotated[int, _at_least(1)] = DEFAULT_MAX_COMMITS
    executor: Executor = DEFAULT_EXECUTOR
    ray_address: str | None = None
    bulk_read: bool = True
    memory_limit: Size | None = None
    min_file_size: Size | None = None
    max_file_size: Size | None = None
    rewrite_all: bool = False
    max_files_to_rewrite: Annotated[int, _at_least(1)] | None = None
    rewrite_job_order: RewriteJobOrder = DEFAULT_REWRITE_JOB_ORDER
    max_failed_commits: Annotated[int, _at_least(0)] | None = None
    strategy: Strategy = DEFAULT_STRATEGY
    sort_order: Annotated[str, checked(_sort_order_syntax)] | None = None
    zorder: Annotated[str, checked(_columns_syntax)] | None = None
    branch: Annotated[str, checked(_branch_name)] = "main"
    output_spec_id: Annotated[int, _at_least(0)] | None = None

    @model_validator(mode="after")
    def _ordering_matches_strategy(self) -> CompactOptions:
        problem = None
        if self.sort_order is not None and self.strategy != "sort":
            problem = UsageError(
                f"sort_order {self.sort_order!r}: is only used with strategy 'sort'",
                "sort_order",
                "strategy",
            )
        elif self.zorder is not None and self.strategy != "zorder":
            problem = UsageError(
                f"zorder {self.zorder!r}: is only used with strategy 'zorder'", "zorder", "strategy"
            )
        elif self.zorder is None and self.strategy == "zorder":
            problem = UsageError(
                "strategy 'zorder': give the columns to interleave with zorder (example: "
                '"event_time, region")',
                "zorder",
                "strategy",
            )
        if problem is not None:
            raise _OptionValueError(problem, names_itself=True)
        return self

    @model_validator(mode="after")
    def _ray_address_needs_ray(self) -> CompactOptions:
        address = self.ray_address
        if address is not None and (self.executor != "ray" or not address.strip()):
            problem = "is empty" if self.executor == "ray" else "is only used with executor 'ray'"
            usage = UsageError(f"ray_address {address!r}: {problem}", "ray_address", "executor")
            raise _OptionValueError(usage, names_itself=True)
        return self

    def given(self) -> dict[str, Any]:
        """The options as keyword arguments of :func:`resolve_options`."""
        return {name: getattr(self, name) for name in CompactOptions.model_fields}


# The options whose value is one of a few names, listed in their errors.
_CHOICES = {
    "executor": EXECUTORS,
    "rewrite_job_order": REWRITE_JOB_ORDERS,
    "strategy": STRATEGIES,
}


def compact_options(**options: Any) -> CompactOptions:
    """Validate option keywords; the first problem is a UsageError naming the option."""
    try:
        return CompactOptions(**options)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        cause = (error.get("ctx") or {}).get("error")
        name = str(error["loc"][0]) if error["loc"] else "options"
        if isinstance(cause, _OptionValueError):
            usage = cause.usage
            raise (usage if usage.options else UsageError(str(usage), name)) from None
        if error["type"] == "extra_forbidden":
            known = ", ".join(CompactOptions.model_fields)
            raise UsageError(f"{name}: unknown option (options: {known})", name) from None
        if error["type"] == "literal_error" and name in _CHOICES:
            allowed = ", ".join(map(repr, _CHOICES[name]))
            message = f"{name} {options[name]!r}: must be one of {allowed}"
            raise UsageError(message, name) from None
        message = error["msg"].removeprefix("Value error, ")
        raise UsageError(f"{name}: {message}", name) from None


def _target_file_size(
    table: str, table_properties: dict[str, str], given: CompactOptions
) -> tuple[int, tuple[str, ...]]:
    """The target file size and any warning about it.

    An explicit target outside the allowed range is a UsageError. A table's
    ``write.target-file-size-bytes`` outside it must not stop inspection, scoring or the daemon:
    the nearest bound is used instead, with a one-line warning (``allow_small_target`` lets a
    small property through as it is).
    """
    allowed = (
        f"{format_size_exact(MIN_TARGET_FILE_SIZE)}..{format_size_exact(MAX_TARGET_FILE_SIZE)}"
    )
    small_ok = given.allow_small_target
    if given.target_file_size is not None:
        target = parse_size(given.target_file_size)
        too_small = target < MIN_TARGET_FILE_SIZE and not small_ok
        if target <= 0 or too_small or target > MAX_TARGET_FILE_SIZE:
            raise UsageError(
                f"target_file_size {given.target_file_size!r} ({format_size(target)}) is outside "
                f"the allowed range {allowed}"
                + (" (smaller only with allow_small_target)" if too_small else ""),
                "target_file_size",
                "allow_small_target",
            )
        return target, ()
    found = _int_property(table_properties, TARGET_FILE_SIZE_PROPERTY, table)
    if found is None:
        return DEFAULT_TARGET_FILE_SIZE, ()
    if (0 < found < MIN_TARGET_FILE_SIZE and small_ok) or (
        MIN_TARGET_FILE_SIZE <= found <= MAX_TARGET_FILE_SIZE
    ):
        return found, ()
    used = MAX_TARGET_FILE_SIZE if found > MAX_TARGET_FILE_SIZE else MIN_TARGET_FILE_SIZE
    return used, (
        f"table {table}: property {TARGET_FILE_SIZE_PROPERTY}={found} is outside {allowed}; "
        f"using {format_size_exact(used)}"
        + (" (allow_small_target uses it as it is)" if 0 < found < MIN_TARGET_FILE_SIZE else ""),
    )


def _file_size_bounds(given: CompactOptions, target: int) -> tuple[int | None, int | None]:
    """``min_file_size`` and ``max_file_size`` as given, checked as Spark checks them."""
    low = parse_size(given.min_file_size) if given.min_file_size is not None else None
    high = parse_size(given.max_file_size) if given.max_file_size is not None else None
    if low is not None and not 0 <= low < target:
        raise UsageError(
            f"min_file_size: {format_size(low)} must be below the target file size "
            f"({format_size(target)})",
            "min_file_size",
        )
    if high is not None and high <= target:
        raise UsageError(
            f"max_file_size: {format_size(high)} must be above the target file size "
            f"({format_size(target)})",
            "max_file_size",
        )
    return low, high


def resolve_options(table: str, table_properties: dict[str, str], **options: Any) -> RewriteOptions:
    """Combine options (see :class:`CompactOptions`) with the table's properties into RewriteOptions.

    Errors are :class:`UsageError` naming the option (``target_file_size: ...``), or
    :class:`ConfigError` naming the table property at fault.
    """
    given = compact_options(**options)
    target, warnings = _target_file_size(table, table_properties, given)
    min_size, max_size = _file_size_bounds(given, target)
    group = DEFAULT_MAX_GROUP_SIZE
    if given.max_group_size:
        group = parse_size(given.max_group_size)
    if group < target:
        raise UsageError(
            f"max_group_size: {format_size(group)} is below the target file size", "max_group_size"
        )
    limit = DEFAULT_MEMORY_LIMIT
    if given.memory_limit is not None:
        limit = parse_size(given.memory_limit)
        if limit < MIN_MEMORY_LIMIT:
            raise UsageError(
                f"memory_limit: {format_size(limit)} is below the minimum "
                f"{format_size(MIN_MEMORY_LIMIT)}",
                "memory_limit",
            )
    # Threads default to this process's cores, fewer if the memory limit allows no more; a
    # Ray cluster schedules by its own resources, one task per worker process (the limit is
    # then per process). More threads than the limit allows get the minimum share each.
    workers = given.parallelism
    if workers is None and given.executor == "threads":
        workers = min(default_parallelism(), (limit - PROCESS_ALLOWANCE) // MIN_WORKER_MEMORY)
    in_process = workers if workers and given.executor == "threads" else 1
    spare = limit - PROCESS_ALLOWANCE - in_process * WORKER_OVERHEAD
    share = max(MIN_SHARE, spare // (3 * in_process))
    row_group = _int_property(table_properties, ROW_GROUP_SIZE_PROPERTY, table)
    row_group = row_group if row_group and row_group > 0 else DEFAULT_ROW_GROUP_SIZE
    return RewriteOptions(
        target_file_size=target,
        min_input_files=given.min_input_files,
        delete_file_threshold=given.delete_file_threshold,
        delete_ratio_threshold=given.delete_ratio_threshold,
        max_group_size=group,
        row_group_size=min(row_group, share),
        read_ahead=share,
        parallelism=workers,
        where=given.where,
        commit_every=given.commit_every,
        max_commits=given.max_commits,
        executor=given.executor,
        ray_address=given.ray_address,
        bulk_read=given.bulk_read,
        memory_limit=limit,
        min_file_size_given=min_size,
        max_file_size_given=max_size,
        rewrite_all=given.rewrite_all,
        max_files_to_rewrite=given.max_files_to_rewrite,
        rewrite_job_order=given.rewrite_job_order,
        max_failed_commits=given.max_failed_commits,
        strategy=given.strategy,
        sort_order=given.sort_order,
        zorder=given.zorder,
        branch=given.branch,
        output_spec_id=given.output_spec_id,
        warnings=warnings,
    )
