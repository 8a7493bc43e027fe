"""A compaction's options: declared once (:class:`CompactOptions`), resolved with the table's
properties into the parts each stage reads (:class:`RewriteOptions`).

Precedence: an option given (a flag, a job file key, a keyword argument), then the table's
Iceberg property, then the default (:mod:`compactor.options.defaults`). Errors name options as
the library spells them (``target_file_size``); the command line shows its flags instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from compactor.errors import ConfigError, UsageError
from compactor.options.defaults import (
    DEFAULT_BRANCH,
    DEFAULT_COMMIT_EVERY,
    DEFAULT_DELETE_FILE_THRESHOLD,
    DEFAULT_DELETE_RATIO_THRESHOLD,
    DEFAULT_EXECUTOR,
    DEFAULT_LEASE_TTL_S,
    DEFAULT_MAX_COMMITS,
    DEFAULT_MAX_GROUP_SIZE,
    DEFAULT_MEMORY_LIMIT,
    DEFAULT_MIN_INPUT_FILES,
    DEFAULT_READ_AHEAD,
    DEFAULT_REWRITE_JOB_ORDER,
    DEFAULT_ROW_GROUP_SIZE,
    DEFAULT_STRATEGY,
    DEFAULT_TARGET_FILE_SIZE,
    MAX_FILE_SIZE_RATIO,
    MAX_TARGET_FILE_SIZE,
    MIN_FILE_SIZE_RATIO,
    MIN_MEMORY_LIMIT,
    MIN_SHARE,
    MIN_TARGET_FILE_SIZE,
    MIN_WORKER_MEMORY,
    PLANNED_FILE_BYTES,
    PLANNING_MEMORY_SHARE,
    PROCESS_ALLOWANCE,
    WORKER_OVERHEAD,
    Executor,
    RewriteJobOrder,
    Strategy,
)
from compactor.options.environment import default_parallelism
from compactor.options.fields import (
    BranchName,
    Filter,
    Flag,
    OptionValueError,
    Ratio,
    Size,
    at_least,
    checked,
    parse_options,
)
from compactor.sizes import format_size, format_size_exact, parse_size

TARGET_FILE_SIZE_PROPERTY = "write.target-file-size-bytes"
ROW_GROUP_SIZE_PROPERTY = "write.parquet.row-group-size-bytes"


def _sort_order_syntax(value: str, option: str) -> None:
    from compactor.planning.sort_order import parse_sort_order

    parse_sort_order(value, option)


def _columns_syntax(value: str, option: str) -> None:
    from compactor.planning.sort_order import parse_columns

    parse_columns(value, option)


class CompactOptions(BaseModel):
    """The options of a compaction one can give — by keyword, flag or job-file key; None = not given.

    Declared once here, with each option's default and help: the library and job files validate
    with it, and ``compactor run`` has one flag per field. :func:`resolve_options` combines them
    with the table's properties into :class:`RewriteOptions`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_file_size: Size | None = Field(
        None,
        description="Output file size: 128MB, 512MiB or bytes, 64MB..512MiB. "
        "Default: the table's write.target-file-size-bytes, else 512MiB.",
    )
    allow_small_target: bool = Field(
        False, description="Allow --target-file-size below 64MB (for tests and experiments)."
    )
    min_input_files: Annotated[int, at_least(1)] = Field(
        DEFAULT_MIN_INPUT_FILES,
        description="Rewrite a group only with at least this many files (or a target's worth "
        "of bytes).",
    )
    delete_file_threshold: Annotated[int, at_least(1)] | None = Field(
        DEFAULT_DELETE_FILE_THRESHOLD,
        description="Rewrite any data file with at least this many delete files (position or "
        "equality) applying to it, whatever its size. Default: off (as Spark).",
    )
    delete_ratio_threshold: Ratio = Field(
        DEFAULT_DELETE_RATIO_THRESHOLD,
        description="Rewrite any data file whose position deletes remove at least this share "
        "of its rows, whatever its size (as Spark's delete-ratio-threshold).",
    )
    max_group_size: Size | None = Field(
        None, description="Largest amount of input in one group (default 100GiB)."
    )
    where: Filter | None = Field(
        None,
        description="Only touch files that may hold rows matching this filter, e.g. "
        "\"day >= '2026-01-01'\".",
    )
    parallelism: Annotated[int, at_least(1)] | None = Field(
        None,
        description="Groups rewritten at once (default: one per core of this process; with "
        "--executor ray, as many as the cluster schedules). While fewer groups than this are "
        "planned, the largest one with two target files' worth of input or more is cut in "
        "two, in write order.",
    )
    commit_every: Annotated[int, at_least(0, "0 (off) or more")] = Field(
        DEFAULT_COMMIT_EVERY,
        description="Partial progress: commit every N finished groups, so finished work "
        "survives a later failure and a failed group fails alone. 0 = one all-or-nothing "
        "commit.",
    )
    max_commits: Annotated[int, at_least(1)] = Field(
        DEFAULT_MAX_COMMITS,
        description="With --commit-every: at most this many commits in one run.",
    )
    executor: Executor = Field(
        DEFAULT_EXECUTOR,
        description="Where groups are rewritten: 'threads' (in this process, --parallelism at "
        "once) or 'ray' (tasks on a Ray cluster; needs pip install 'compactor[ray]').",
    )
    ray_address: str | None = Field(
        None,
        description="With --executor ray: the cluster to connect to (e.g. ray://head:10001 or "
        "auto). Default: Ray's own (RAY_ADDRESS, else a local Ray).",
    )
    bulk_read: bool = Field(
        True,
        description="Read Parquet files without equality deletes in bulk: small files many at "
        "once, larger ones streamed a batch at a time. --no-bulk-read reads every file through "
        "the Iceberg read path (slower, and it decodes a whole row group at a time; to "
        "diagnose).",
    )
    memory_limit: Size | None = Field(
        None,
        description="Resident memory this run aims to stay under, e.g. 1GiB (default 384MiB, "
        "at least 304MiB). It sets the buffers of each worker and, without --parallelism, how "
        "many run at once: one per 144MiB past 160MiB (two from 448MiB). With --executor ray: "
        "per Ray worker process. Planning keeps as many candidate files as half of it past "
        "160MiB holds at 900 bytes each (130,489 at 384MiB); the others wait for the next run. "
        "The workers' buffers shrink by what the plan keeps.",
    )
    min_file_size: Size | None = Field(
        None,
        description="Files below this size are rewritten (Spark's min-file-size; default 75% "
        "of the target).",
    )
    max_file_size: Size | None = Field(
        None,
        description="Files above this size are rewritten, split at the target (Spark's "
        "max-file-size; default 180% of the target).",
    )
    rewrite_all: Annotated[bool, Flag(("--rewrite-all",))] = Field(
        False,
        description="Rewrite every file (within --where), whatever its size, and every group, "
        "whatever --min-input-files says (Spark's rewrite-all).",
    )
    max_files_to_rewrite: Annotated[int, at_least(1)] | None = Field(
        None,
        description="Rewrite only the groups, in --rewrite-job-order, that fit in this many "
        "input files together; the rest wait for the next run (Spark's max-files-to-rewrite).",
    )
    rewrite_job_order: RewriteJobOrder = Field(
        DEFAULT_REWRITE_JOB_ORDER,
        description="Order groups are rewritten and committed in: most-fragmented (most files "
        "first), bytes-asc, bytes-desc, files-asc, files-desc (Spark's rewrite-job-order).",
    )
    max_failed_commits: Annotated[int, at_least(0)] | None = Field(
        None,
        description="With --commit-every: stop the run once more commits than this failed "
        "(default: --max-commits; Spark's partial-progress.max-failed-commits).",
    )
    strategy: Strategy = Field(
        DEFAULT_STRATEGY,
        description="How each group's rows are ordered in the new files: binpack (as read), "
        "sort (by --sort-order, else the table's sort order) or zorder (by --zorder), Spark's "
        "strategies. Sorting happens per group, out of core in --memory-limit, spilling to "
        "$TMPDIR.",
    )
    sort_order: Annotated[str, checked(_sort_order_syntax)] | None = Field(
        None,
        description="With --strategy sort: columns to sort by, in Spark's syntax, e.g. "
        '"event_time ASC NULLS LAST, region DESC" (default ASC; nulls first for ASC, last for '
        "DESC).",
    )
    zorder: Annotated[str, checked(_columns_syntax)] | None = Field(
        None,
        description="With --strategy zorder: the columns whose values are interleaved, e.g. "
        '"lat, lon" (two to four columns cluster best).',
    )
    branch: BranchName = Field(
        DEFAULT_BRANCH,
        description="Compact this branch of the table: plan from its head and commit the "
        "`replace` snapshot to it (Spark's branch option); other branches and main stay as "
        "they are.",
    )
    output_spec_id: Annotated[int, at_least(0)] | None = Field(
        None,
        description="Rewrite the files of every other partition spec into this one (usually "
        "the current spec after a partitioning change), whatever their size, split by its "
        "partitions (Spark's output-spec-id). Default: each file keeps its spec.",
    )

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
            raise OptionValueError(problem, names_itself=True)
        return self

    @model_validator(mode="after")
    def _ray_address_needs_ray(self) -> CompactOptions:
        address = self.ray_address
        if address is not None and (self.executor != "ray" or not address.strip()):
            problem = "is empty" if self.executor == "ray" else "is only used with executor 'ray'"
            usage = UsageError(f"ray_address {address!r}: {problem}", "ray_address", "executor")
            raise OptionValueError(usage, names_itself=True)
        return self

    def given(self) -> dict[str, Any]:
        """The options as keyword arguments of :func:`resolve_options`."""
        return {name: getattr(self, name) for name in CompactOptions.model_fields}


def compact_options(**options: Any) -> CompactOptions:
    """Validate option keywords; the first problem is a UsageError naming the option."""
    return parse_options(CompactOptions, options)


@dataclass(frozen=True)
class PlanOptions:
    """What the planner reads: which files are candidates and how they are grouped."""

    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    min_input_files: int = DEFAULT_MIN_INPUT_FILES
    delete_file_threshold: int | None = DEFAULT_DELETE_FILE_THRESHOLD
    delete_ratio_threshold: float = DEFAULT_DELETE_RATIO_THRESHOLD
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE
    where: str | None = None
    # Files below min_file_size or above max_file_size are candidates (Spark's names); None:
    # MIN_FILE_SIZE_RATIO and MAX_FILE_SIZE_RATIO of the target.
    min_file_size_given: int | None = None
    max_file_size_given: int | None = None
    rewrite_all: bool = False
    max_files_to_rewrite: int | None = None
    rewrite_job_order: str = DEFAULT_REWRITE_JOB_ORDER
    strategy: str = DEFAULT_STRATEGY
    sort_order: str | None = None  # None with strategy sort: the table's sort order
    zorder: str | None = None
    branch: str = DEFAULT_BRANCH  # the branch planned from (and committed to)
    # Files of other partition specs are rewritten into this one (None: each keeps its spec).
    output_spec_id: int | None = None
    # While fewer groups are planned, the largest is cut in two: the groups rewritten at once.
    min_groups: int = 1
    # Candidate files planning keeps (planning_budget of the memory limit); those found past
    # it are left for the next run. None: no bound.
    max_candidate_files: int | None = None

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


@dataclass(frozen=True)
class ExecutionOptions:
    """What rewriting reads: where tasks run, how many at once, and their memory."""

    parallelism: int | None = 1  # None: as many as the Ray cluster schedules
    executor: str = DEFAULT_EXECUTOR
    ray_address: str | None = None
    bulk_read: bool = True
    memory_limit: int = DEFAULT_MEMORY_LIMIT
    # In-memory bytes of the rows of the row group being filled (the table's
    # write.parquet.row-group-size-bytes caps its written bytes).
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE
    read_ahead: int = DEFAULT_READ_AHEAD

    def beside_plan(self, planned_files: int) -> ExecutionOptions:
        """These options for the rewrite of a plan that keeps ``planned_files`` input files in
        this process (PLANNED_FILE_BYTES each) until its commit: threads of this process share
        the memory limit with it, so their shares shrink (never below MIN_SHARE); tasks on a
        Ray cluster run in processes of their own."""
        if self.executor != "threads":
            return self
        share = worker_share(
            self.memory_limit, self.parallelism or 1, planned_files * PLANNED_FILE_BYTES
        )
        return replace(
            self,
            row_group_size=min(self.row_group_size, share),
            read_ahead=min(self.read_ahead, share),
        )


@dataclass(frozen=True)
class CommitOptions:
    """What committing reads: partial progress and the run's lease."""

    commit_every: int = DEFAULT_COMMIT_EVERY
    max_commits: int = DEFAULT_MAX_COMMITS
    max_failed_commits: int | None = None  # None: max_commits (Spark's default)
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S

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


@dataclass(frozen=True)
class RewriteOptions:
    """Options of one compaction run, after flags and table properties are resolved: the
    planner reads ``plan``, the rewrite tasks ``execution``, the committer ``commit``."""

    plan: PlanOptions = field(default_factory=PlanOptions)
    execution: ExecutionOptions = field(default_factory=ExecutionOptions)
    commit: CommitOptions = field(default_factory=CommitOptions)
    warnings: tuple[str, ...] = ()  # one line each, e.g. a table property replaced by a bound


def _int_property(properties: dict[str, str], name: str, table: str) -> int | None:
    if name not in properties:
        return None
    try:
        return int(properties[name])
    except ValueError:
        raise ConfigError(
            f"table {table}: property {name}={properties[name]!r} is not an integer"
        ) from None


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


def parse_memory_limit(given: int | str | None) -> int:
    """The ``memory_limit`` option in bytes: as given (at least the minimum), else the default."""
    if given is None:
        return DEFAULT_MEMORY_LIMIT
    limit = parse_size(given)
    if limit < MIN_MEMORY_LIMIT:
        raise UsageError(
            f"memory_limit: {format_size(limit)} is below the minimum "
            f"{format_size(MIN_MEMORY_LIMIT)}",
            "memory_limit",
        )
    return limit


def planning_budget(memory_limit: int) -> int:
    """Candidate files a run under ``memory_limit`` keeps while planning: PLANNED_FILE_BYTES
    each in PLANNING_MEMORY_SHARE of the limit past the process allowance."""
    return int((memory_limit - PROCESS_ALLOWANCE) * PLANNING_MEMORY_SHARE) // PLANNED_FILE_BYTES


def worker_share(memory_limit: int, workers: int, held: int = 0) -> int:
    """Bytes of each of the three equal shares of a worker (rows read ahead, the row group being
    filled, room to decode and encode) when ``workers`` run in a process under ``memory_limit``
    beside ``held`` bytes of its own: what is left past the process allowance and the workers'
    overheads, in thirds, at least MIN_SHARE."""
    spare = memory_limit - PROCESS_ALLOWANCE - held - workers * WORKER_OVERHEAD
    return max(MIN_SHARE, spare // (3 * workers))


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
    limit = parse_memory_limit(given.memory_limit)
    # Threads default to this process's cores, fewer if the memory limit allows no more; a
    # Ray cluster schedules by its own resources, one task per worker process (the limit is
    # then per process). More threads than the limit allows get the minimum share each.
    workers = given.parallelism
    if workers is None and given.executor == "threads":
        workers = min(default_parallelism(), (limit - PROCESS_ALLOWANCE) // MIN_WORKER_MEMORY)
    in_process = workers if workers and given.executor == "threads" else 1
    share = worker_share(limit, in_process)
    # The table's row-group size counts written bytes (the writer closes row groups by it);
    # what a row group's rows may take in memory until it is written is one share.
    _int_property(table_properties, ROW_GROUP_SIZE_PROPERTY, table)
    return RewriteOptions(
        plan=PlanOptions(
            target_file_size=target,
            min_input_files=given.min_input_files,
            delete_file_threshold=given.delete_file_threshold,
            delete_ratio_threshold=given.delete_ratio_threshold,
            max_group_size=group,
            where=given.where,
            min_file_size_given=min_size,
            max_file_size_given=max_size,
            rewrite_all=given.rewrite_all,
            max_files_to_rewrite=given.max_files_to_rewrite,
            rewrite_job_order=given.rewrite_job_order,
            strategy=given.strategy,
            sort_order=given.sort_order,
            zorder=given.zorder,
            branch=given.branch,
            output_spec_id=given.output_spec_id,
            min_groups=workers or 1,
            max_candidate_files=planning_budget(limit),
        ),
        execution=ExecutionOptions(
            parallelism=workers,
            executor=given.executor,
            ray_address=given.ray_address,
            bulk_read=given.bulk_read,
            memory_limit=limit,
            row_group_size=share,
            read_ahead=share,
        ),
        commit=CommitOptions(
            commit_every=given.commit_every,
            max_commits=given.max_commits,
            max_failed_commits=given.max_failed_commits,
        ),
        warnings=warnings,
    )
