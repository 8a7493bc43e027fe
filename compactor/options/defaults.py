"""Every default and bound of compactor's options, in one place.

The option models (:mod:`compactor.options.compact`, :mod:`compactor.options.maintenance`) and
the job-file sections take their defaults from here; the command line shows them.
"""

from __future__ import annotations

from typing import Literal, get_args

from compactor.durations import DAY_MS
from compactor.sizes import GiB, MiB

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
DEFAULT_BRANCH = "main"
# A group's rewrite is not committed when its output is more than this share larger than its
# input, unless it applies deletes, moves rows to another spec, or divides the file count by at
# least MIN_FILE_REDUCTION_FOR_GROWTH (many small files into few are worth a few more bytes).
MAX_OUTPUT_GROWTH = 0.02
MIN_FILE_REDUCTION_FOR_GROWTH = 2
# Memory: a run aims to keep its process's resident memory under --memory-limit. Past a fixed
# allowance for the interpreter and libraries, each worker costs a fixed overhead plus three
# equal shares (ClickHouse's S3 insert guide: buffer ~ limit / (3 x workers)): rows read ahead
# of the writer, the rows of the row group being filled (pyarrow writes a row group from rows all
# in memory: this caps it before the table's row-group size, which counts written bytes, unless
# the limit is large), and room for decoding and encoding.
DEFAULT_MEMORY_LIMIT = 384 * MiB
PROCESS_ALLOWANCE = 160 * MiB
# A worker's cost beyond its shares: the Parquet reader's and writer's per-column state and
# its threads' heaps. Measured 85-105 MB on TPC-DS store_sales (23 columns); narrower tables
# use less.
WORKER_OVERHEAD = 96 * MiB
MIN_SHARE = 16 * MiB
# pyarrow's allocator keeps the pages it frees for its next allocations; a worker hands them
# back to the system once a row group is written with the process past this share of its
# limit (measured on the large workload: peaks of 357-391 MiB at 384 MiB became 351-358, at no
# cost in time; handing them back after every row group cost 12%).
HAND_BACK_AT = 0.9
# The least one worker gets; fewer workers run when the limit allows no more.
MIN_WORKER_MEMORY = WORKER_OVERHEAD + 3 * MIN_SHARE
MIN_MEMORY_LIMIT = PROCESS_ALLOWANCE + MIN_WORKER_MEMORY
# Planning runs before any worker: the candidate files it keeps may take this share of the
# limit past the process allowance, at PLANNED_FILE_BYTES each (measured on 100,000 files of
# store_sales: about 350 bytes as planning keeps a candidate, 500 more for its input in the
# run's task; see docs/benchmarks.md). Candidates past that budget wait for the next run.
PLANNING_MEMORY_SHARE = 0.5
PLANNED_FILE_BYTES = 900
# Decoded input bytes each worker may hold ahead of the writer, when no limit is computed.
DEFAULT_READ_AHEAD = 64 * MiB
# Files at least this large are streamed batch by batch instead of being read ahead whole.
STREAM_FILE_THRESHOLD = 16 * MiB
# Manifests read at once while planning or listing what a table references.
MANIFEST_READERS = 8
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

# Position-delete files roll over at this size (Iceberg's write.delete.target-file-size-bytes).
DEFAULT_DELETE_TARGET_FILE_SIZE = 64 * MiB

# Snapshot expiry, when neither an option nor the table's history.expire.* properties say
# otherwise (Iceberg's defaults).
DEFAULT_MAX_SNAPSHOT_AGE_MS = 5 * DAY_MS
DEFAULT_MIN_SNAPSHOTS_TO_KEEP = 1

# Orphan removal deletes only files older than this; never younger than MIN_ORPHAN_AGE_MS
# unless explicitly allowed (--allow-short-older-than): a commit or a compaction run in flight
# may still need them. Spark's remove_orphan_files defaults to 3 days, Trino refuses less than
# 7 days by default.
DEFAULT_ORPHAN_AGE = "3d"
MIN_ORPHAN_AGE_MS = DAY_MS

# The daemon's triggers: compact a table once this many small files sit in partitions a
# rewrite would shrink (or this many delete files), then rest for the cool-down.
DEFAULT_MIN_SMALL_FILES = 12
DEFAULT_MIN_DELETE_FILES = 8
DEFAULT_COOLDOWN = "15m"
# The daemon's [rewrite_deletes] triggers, per partition. Equality deletes are converted once a
# partition holds this many equality-delete files (unless a compaction rewrites its data files
# anyway): on the CDC benchmark one file already makes Iceberg Java's scan several times slower
# than after its conversion, which costs less than half a rewrite (docs/benchmarks.md).
# Position-delete files are merged once a partition holds this many (Iceberg's
# rewrite_position_delete_files min-input-files).
DEFAULT_MIN_EQUALITY_DELETE_FILES = 1
DEFAULT_MIN_POSITION_DELETE_FILES = 5

# Manifests: a manifest rewrite writes manifests of about this size (Iceberg's
# commit.manifest.target-size-bytes, default 8 MB). A group of manifests (one content, one spec)
# is rewritten when it has more manifests than its bytes fill at MIN_MANIFEST_FILL of the target
# each, when one of more than one entry is over MAX_MANIFEST_FILL of the target, or when their
# partition ranges overlap.
DEFAULT_TARGET_MANIFEST_SIZE = 8 * MiB
MIN_MANIFEST_FILL = 0.8
MAX_MANIFEST_FILL = 1.5
# The daemon's trigger: rewrite a table's manifests once it has this many (Iceberg's
# commit.manifest.min-count-to-merge), then rest for the cool-down.
DEFAULT_MIN_MANIFESTS = 100
# How long a catalog's server may take to accept a connection before it is reported unreachable.
DEFAULT_CATALOG_TIMEOUT = "5s"
