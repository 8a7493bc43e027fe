"""``compactor bench plan``: how long planning takes on a table of many tiny files.

The table is TPC-DS ``store_sales`` (23 columns) as ``--files`` files of ``--rows-per-file``
rows each, over ``--commits`` fast-append commits, built as fast as this machine allows:

- every file is its own Parquet file, written with the table's codec and the Iceberg field
  ids, its column metrics (as pyiceberg computes them) in its manifest entry. Worker processes
  (one per core) write them; rows are taken in turn from the generated store_sales rows
  (``--scale-factor``), starting again from the first when they run out. With
  ``distinct_files`` set, only that many are written and the others are hard links to them in
  turn (same bytes, same metrics): planning reads manifests only, and a million files then
  build in minutes;
- the commits are fast appends as pyiceberg's ``append`` leaves them (one manifest each, the
  parent's manifests carried over, sequence numbers, summaries), sent to the catalog
  :data:`~compactor.bench.tpcds.SNAPSHOTS_PER_CATALOG_COMMIT` snapshots at a time
  (:func:`~compactor.bench.tpcds.commit_appends`): the table ends with one snapshot and one
  manifest per commit, its current snapshot listing them all.

Then, ``--repetitions`` times, a fresh process loads the table from the catalog and runs
``compactor.plan(table)`` (planning only: manifests read, candidates picked, groups packed;
nothing written) under ``--memory-limit``, measuring each step's seconds, CPU, peak RSS,
manifests read, files planned and the candidates left for a next run past the limit's budget.
The median run is the result.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record

from compactor.bench.phases import BenchTable, in_fresh_process, plan_phase
from compactor.bench.progress import Steps
from compactor.bench.tpcds import (
    GENERATOR_FILE,
    NAMESPACE,
    commit_appends,
    generate,
    split_evenly,
)
from compactor.bench.warehouse import CATALOG_NAME, Warehouse
from compactor.errors import UsageError
from compactor.iceberg.duckdb_views import duckdb_path
from compactor.iceberg.pyiceberg_compat import parquet_writer_kwargs, to_write_batch, write_schema

TABLE = "store_sales"
SOURCE_FILE = "plan-source.arrow"
# Files a writer process writes per task (a task's results come back to the driver at once).
FILES_PER_TASK = 250


@dataclass(frozen=True)
class PlanParameters:
    """What ``bench plan`` was asked to do."""

    files: int
    commits: int
    rows_per_file: int
    scale_factor: float
    repetitions: int
    target_file_size: str
    allow_small_target: bool
    # Parquet files written; the others are hard links to them (None: every file written).
    distinct_files: int | None = None
    memory_limit: str | None = None  # compactor's --memory-limit (None: its default)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def plan_parameters(
    *,
    files: int,
    commits: int,
    rows_per_file: int,
    scale_factor: float,
    repetitions: int,
    target_file_size: str,
    allow_small_target: bool,
    distinct_files: int | None = None,
    memory_limit: str | None = None,
) -> PlanParameters:
    """Checked ``bench plan`` options."""
    from compactor.options import resolve_options

    if files < 1 or not 1 <= commits <= files:
        raise UsageError(
            f"--files {files} --commits {commits}: need 1 <= commits <= files", "files", "commits"
        )
    if distinct_files is not None and not 1 <= distinct_files <= files:
        raise UsageError(f"distinct files {distinct_files}: need 1 <= distinct files <= files")
    if rows_per_file < 1 or repetitions < 1:
        raise UsageError("--rows-per-file and --repetitions must be 1 or more")
    if scale_factor <= 0:
        raise UsageError(f"--scale-factor: must be above 0, got {scale_factor}")
    resolve_options(
        "tpcds",
        {},
        target_file_size=target_file_size,
        allow_small_target=allow_small_target,
        memory_limit=memory_limit,
    )
    return PlanParameters(
        files=files,
        commits=commits,
        rows_per_file=rows_per_file,
        scale_factor=scale_factor,
        repetitions=repetitions,
        target_file_size=target_file_size,
        allow_small_target=allow_small_target,
        distinct_files=distinct_files,
        memory_limit=memory_limit,
    )


# --- writing the files (in worker processes) ---------------------------------------------------


@dataclass
class _Writer:
    """What a writer process keeps between tasks."""

    source: pa.Table
    file_schema: Schema
    writer_kwargs: dict[str, Any]
    stats_plan: Any
    column_mapping: dict[str, int]


_writer: _Writer | None = None


def _start_writer(source_path: str, schema_json: str, properties: dict[str, str]) -> None:
    """A writer process's initializer: the source rows (memory-mapped) and the write settings."""
    global _writer
    with pa.memory_map(source_path) as source:
        rows = pa.ipc.open_file(source).read_all()
    schema = Schema.model_validate_json(schema_json)
    _writer = _Writer(
        source=rows,
        file_schema=schema,
        writer_kwargs=parquet_writer_kwargs(properties),
        stats_plan=compute_statistics_plan(schema, properties),
        column_mapping=parquet_path_to_id_mapping(schema),
    )


# A file written: its name, size and metrics (pyiceberg's DataFile statistics).
Written = tuple[str, int, dict[str, Any]]


def write_files(
    first: int, count: int, rows_per_file: int, directory: str, prefix: str
) -> list[Written]:
    """Write files ``first`` to ``first + count - 1`` into ``directory``: (name, size, metrics)."""
    assert _writer is not None, "the writer process was not started with _start_writer"
    source = _writer.source
    cycle = max(1, source.num_rows - rows_per_file + 1)
    written = []
    for number in range(first, first + count):
        rows = source.slice((number * rows_per_file) % cycle, rows_per_file)
        name = f"{prefix}-{number:07d}.parquet"
        with pa.OSFile(f"{directory}/{name}", "wb") as sink:
            with pq.ParquetWriter(
                sink, source.schema, store_decimal_as_integer=True, **_writer.writer_kwargs
            ) as writer:
                writer.write_table(rows)
            size = sink.tell()
        metrics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=writer.writer.metadata,
            stats_columns=_writer.stats_plan,
            parquet_column_mapping=_writer.column_mapping,
        )
        written.append((name, size, metrics.to_serialized_dict()))
    return written


def _ordered(
    pool: ProcessPoolExecutor, calls: Iterator[tuple[Any, ...]], window: int
) -> Iterator[Any]:
    """``pool.map`` with at most ``window`` calls submitted and not yet consumed."""
    pending: deque[Future[Any]] = deque()
    for args in calls:
        pending.append(pool.submit(write_files, *args))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def build_table(
    parameters: PlanParameters,
    warehouse: Warehouse,
    workdir: Path,
    steps: Steps,
) -> dict[str, Any]:
    """Create ``tpcds.store_sales`` of ``parameters.files`` tiny files in ``commits`` commits."""
    started = time.monotonic()
    with steps.step(f"generating TPC-DS at scale factor {parameters.scale_factor} (dsdgen)"):
        generator = generate(workdir / GENERATOR_FILE, parameters.scale_factor)
    try:
        wanted = parameters.files * parameters.rows_per_file
        rows = generator.execute(f"SELECT * FROM {TABLE} LIMIT {wanted}").fetch_arrow_table()
    finally:
        generator.close()
    if rows.num_rows < parameters.rows_per_file:
        raise UsageError(
            f"--rows-per-file {parameters.rows_per_file}: {TABLE} has only {rows.num_rows} rows "
            "at this scale factor",
            "rows_per_file",
        )
    catalog = warehouse.catalog()
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(NAMESPACE)
    table = catalog.create_table(
        f"{NAMESPACE}.{TABLE}", schema=rows.schema, properties={"format-version": "2"}
    )
    metadata = table.metadata
    file_schema, _ = write_schema(metadata)
    read_schema = pyarrow_to_schema(
        rows.schema, name_mapping=metadata.schema().name_mapping, format_version=2
    )
    source = pa.Table.from_batches(
        [to_write_batch(b, read_schema, file_schema) for b in rows.combine_chunks().to_batches()]
    )
    source_path = workdir / SOURCE_FILE
    with pa.OSFile(str(source_path), "wb") as sink, pa.ipc.new_file(sink, source.schema) as ipc:
        ipc.write_table(source)
    del rows, source

    data_uri = f"{table.location().rstrip('/')}/data"
    data_dir = duckdb_path(data_uri)
    if "://" in data_dir:
        raise UsageError("bench plan: the warehouse must be on local disk")
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    prefix = f"00000-{uuid.uuid4()}"
    per_commit = split_evenly(parameters.files, parameters.commits)
    rows_per_file = parameters.rows_per_file
    distinct = parameters.distinct_files or parameters.files
    calls = (
        (first, min(FILES_PER_TASK, distinct - first), rows_per_file, data_dir, prefix)
        for first in range(0, distinct, FILES_PER_TASK)
    )
    workers = multiprocessing.cpu_count()
    written_bytes = 0

    def every_file(results: Iterator[list[Written]]) -> Iterator[Written]:
        """The written files, then hard links to them in turn up to ``parameters.files``."""
        sources: list[Written] = []
        for batch in results:
            yield from batch
            if distinct < parameters.files:
                sources += batch
        for number in range(distinct, parameters.files):
            source, size, metrics = sources[number % distinct]
            name = f"{prefix}-{number:07d}.parquet"
            os.link(f"{data_dir}/{source}", f"{data_dir}/{name}")
            yield name, size, metrics

    def appends(files_written: Iterator[Written]) -> Iterator[list[Any]]:
        nonlocal written_bytes
        for count in per_commit:
            files = []
            for name, size, metrics in islice(files_written, count):
                written_bytes += size
                files.append(
                    DataFile.from_args(
                        content=DataFileContent.DATA,
                        file_path=f"{data_uri}/{name}",
                        file_format=FileFormat.PARQUET,
                        partition=Record(),
                        file_size_in_bytes=size,
                        sort_order_id=None,
                        spec_id=metadata.default_spec_id,
                        equality_ids=None,
                        key_metadata=None,
                        **metrics,
                    )
                )
            yield files

    description = f"writing {parameters.files:,} files in {parameters.commits:,} commits"
    with (
        steps.step(description, total=parameters.commits) as advance,
        ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_writer,
            initargs=(str(source_path), file_schema.model_dump_json(), metadata.properties),
        ) as pool,
    ):
        results = _ordered(pool, calls, window=2 * workers)
        table, catalog_commits = commit_appends(
            table, appends(every_file(results)), on_snapshot=lambda _: advance(1)
        )
    source_path.unlink()
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    totals = summary.additional_properties if summary else {}
    return {
        "table": f"{NAMESPACE}.{TABLE}",
        "files": int(totals.get("total-data-files", 0)),
        "bytes": int(totals.get("total-files-size", 0)),
        "rows": int(totals.get("total-records", 0)),
        "commits": len(table.metadata.snapshots),
        "catalog_commits": catalog_commits,
        "rows_per_file": parameters.rows_per_file,
        "distinct_files": distinct,
        "writer_processes": workers,
        "seconds": round(time.monotonic() - started, 3),
    }


# --- measuring planning (in a fresh process) ---------------------------------------------------


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose plan time is the median (the lower middle one of an even count)."""
    ordered = sorted(runs, key=lambda r: r["plan_seconds"])
    return ordered[(len(ordered) - 1) // 2]


def run_plan_benchmark(
    parameters: PlanParameters,
    warehouse: Warehouse,
    workdir: Path,
    steps: Steps,
    measure: Callable[..., dict[str, Any]] = in_fresh_process,
) -> dict[str, Any]:
    """Build the table, then time planning it; returns the report's body."""
    built = build_table(parameters, warehouse, workdir, steps)
    steps.note(
        f"built {built['table']}: {built['files']:,} files, {built['bytes'] / 1e6:.1f} MB in "
        f"{built['commits']:,} commits ({built['seconds']:.1f}s)"
    )
    runs = []
    for run in range(parameters.repetitions):
        with steps.step(f"planning, run {run + 1} of {parameters.repetitions} (fresh process)"):
            runs.append(
                measure(
                    plan_phase,
                    BenchTable(CATALOG_NAME, warehouse.catalog_properties, f"{NAMESPACE}.{TABLE}"),
                    parameters.target_file_size,
                    parameters.allow_small_target,
                    parameters.memory_limit,
                )
            )
    median = _median_run(runs)
    steps.note(
        f"planned {median['files_planned']:,} files ({median['deferred_files']:,} left for a "
        f"next run) from {median['manifests_read']:,} manifests in "
        f"{median['plan_seconds']:.2f}s (median of {len(runs)})"
    )
    return {
        "table": built,
        "plan": median,
        "runs": runs,
        "plan_seconds": {
            "median": median["plan_seconds"],
            "min": min(r["plan_seconds"] for r in runs),
            "max": max(r["plan_seconds"] for r in runs),
            "mean": round(statistics.fmean(r["plan_seconds"] for r in runs), 3),
        },
    }
