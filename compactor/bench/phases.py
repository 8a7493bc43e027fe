"""What the benchmarks' fresh processes run to measure compactor and plain pyarrow, and how each
measures itself.

A phase runs in a new (spawned) process so that its peak RSS is its own. This module loads no
more than ``compactor run`` does (no DuckDB, nothing of the bench's loaders): a phase of
compactor's holds what a user's process would, and is measured against ``--memory-limit`` as
one. DuckDB's own phases live beside their bench.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from compactor.api import compact, rewrite_deletes, rewrite_manifests
from compactor.execute import make_executor
from compactor.execute.executors import Executor, Outcome
from compactor.iceberg import pyiceberg_compat
from compactor.options import resolve_options
from compactor.planning.manifest_groups import manifest_stats
from compactor.planning.planner import plan_rewrite
from compactor.planning.tasks import RewriteTask
from compactor.rewrite import phase_times
from compactor.rewrite.task_runner import CancelToken
from compactor.sizes import peak_rss_bytes, proc_status_bytes

MB = 10**6
# A file is closed once it is this close to the target (as compactor's writer does).
FILL_RATIO = 0.97


@dataclass(frozen=True)
class BenchTable:
    """A table another process can load: its SQL catalog's name and properties, its name."""

    catalog_name: str
    catalog_properties: dict[str, str]
    identifier: str

    def load(self) -> Table:
        """The table, read with compactor's fixes to pyiceberg in place, as compactor reads it."""
        pyiceberg_compat.install()
        return SqlCatalog(self.catalog_name, **self.catalog_properties).load_table(self.identifier)


class PhaseUsage:
    """Wall time, CPU time and peak RSS of this process from now on (one phase).

    On Linux the RSS high-water mark is reset first (``/proc/self/clear_refs``), so the peak
    is the phase's own and not an earlier one's, nor the parent's before ``exec``.
    """

    def __init__(self) -> None:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
        self.baseline_rss = proc_status_bytes("VmRSS") or peak_rss_bytes()
        self._cpu = _cpu_seconds()
        # time.monotonic() is one clock for every process of the machine (CLOCK_MONOTONIC on
        # Linux): the 2-process floor's wall time is the span of its halves' start and end.
        self._started_at = time.monotonic()
        self._started = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the phase began."""
        return time.perf_counter() - self._started

    def mark(self) -> Mark:
        """Where the phase stands now (see :class:`Mark`)."""
        return Mark(self.elapsed(), _cpu_seconds() - self._cpu, _native_thread_cpu())

    def resources(self) -> dict[str, Any]:
        """CPU seconds since the phase began, peak RSS during it and RSS when it began."""
        return {
            "cpu_seconds": round(_cpu_seconds() - self._cpu, 3),
            "peak_rss_bytes": peak_rss_bytes(),
            "baseline_rss_bytes": self.baseline_rss,
        }

    def result(self, input_bytes: int, outputs: list[int], input_files: int) -> dict[str, Any]:
        return {
            **rates(self.elapsed(), input_bytes, input_files),
            **self.resources(),
            "input_files": input_files,
            "input_bytes": input_bytes,
            "output_files": len(outputs),
            "output_bytes": sum(outputs),
            "output_file_sizes": sorted(outputs),
            "started_at": self._started_at,
            "finished_at": time.monotonic(),
        }


def rates(seconds: float, input_bytes: int, input_files: int) -> dict[str, Any]:
    rate = input_bytes / MB / seconds if seconds > 0 else 0.0
    return {
        "seconds": round(seconds, 3),
        "mb_per_s": round(rate, 2),
        "mb_per_s_per_core": round(rate / multiprocessing.cpu_count(), 2),
        "files_per_s": round(input_files / seconds, 1) if seconds > 0 else 0.0,
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Mark(NamedTuple):
    """A moment of a phase: seconds and CPU seconds since it began, and the CPU seconds so far
    of the threads of the process that Python did not start (pyarrow's thread pools)."""

    seconds: float
    cpu_seconds: float
    native_cpu_seconds: float


def _native_thread_cpu() -> float:
    """CPU seconds of this process's live threads unknown to Python, from ``/proc`` (Linux;
    0 elsewhere): pyarrow's thread pools, which decode what its scanners read."""
    python = {t.native_id for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    with contextlib.suppress(OSError):
        for task in Path("/proc/self/task").iterdir():
            if int(task.name) in python:
                continue
            with contextlib.suppress(OSError):  # the thread has ended
                stat = (task / "stat").read_text()
                utime, stime = stat[stat.rindex(")") + 2 :].split()[11:13]
                total += int(utime) + int(stime)
    return total / tick


def floor_phase(
    files: list[str],
    out_dir: str,
    input_bytes: int,
    target: int,
    row_group_size: int,
    writer_kwargs: dict[str, Any],
) -> dict[str, Any]:
    """Read ``files`` with pyarrow and write them into target-size Parquet files in ``out_dir``."""
    usage = PhaseUsage()
    dataset = ds.dataset(files, format="parquet")
    budget = min(row_group_size, target)
    outputs: list[int] = []
    writer: pq.ParquetWriter | None = None
    sink: pa.NativeFile | None = None
    pending: list[pa.RecordBatch] = []
    buffered = 0

    def flush() -> None:
        nonlocal writer, sink, pending, buffered
        if writer is None:
            sink = pa.OSFile(f"{out_dir}/floor-{len(outputs):05d}.parquet", "wb")
            writer = pq.ParquetWriter(
                sink, dataset.schema, store_decimal_as_integer=True, **writer_kwargs
            )
        rows = pa.Table.from_batches(pending, schema=dataset.schema)
        writer.write_table(rows, row_group_size=max(rows.num_rows, 1))
        pending, buffered = [], 0
        assert sink is not None
        if sink.tell() >= target * FILL_RATIO:
            close()

    def close() -> None:
        nonlocal writer, sink
        if writer is not None and sink is not None:
            writer.close()
            outputs.append(sink.tell())
            sink.close()
            writer = sink = None

    for batch in dataset.to_batches(use_threads=True):
        pending.append(batch)
        buffered += batch.nbytes
        if buffered >= budget:
            flush()
    if pending:
        flush()
    close()
    return usage.result(input_bytes, outputs, len(files))


# Where a rewrite task's CPU goes (compactor.rewrite.phase_times), in the order of the work.
TASK_PHASES = ("open_footer", "projection", "decode", "read_each", "write", "statistics")


class StageClock:
    """compactor's executor, marking the phase (:meth:`PhaseUsage.mark`) when tasks are first
    handed to it (planning done) and when the last result comes back (the commit next)."""

    def __init__(self, executor: Executor, mark: Callable[[], Mark]) -> None:
        self._executor, self._mark = executor, mark
        self.planned: Mark | None = None
        self.rewritten: Mark | None = None

    def run(
        self, tasks: Sequence[RewriteTask], cancel: CancelToken
    ) -> Iterator[tuple[RewriteTask, Outcome]]:
        self.planned = self.planned or self._mark()
        for outcome in self._executor.run(tasks, cancel):
            self.rewritten = self._mark()
            yield outcome

    def close(self) -> None:
        self._executor.close()


def breakdown(
    phase: Mapping[str, Any], stages: StageClock, tasks: Sequence[Mapping[str, float]]
) -> dict[str, Any]:
    """Where compactor's ``phase`` went: wall and CPU seconds of planning (with the run's start),
    the rewrite and the commit (with the run's end), in turn; the rewrite's CPU split into the
    ``tasks``' phases (their threads' own CPU), pyarrow's threads, and the rest (threads that
    ended, the interpreter between phases); and CPU milliseconds per input file."""
    seconds, cpu = phase["seconds"], phase["cpu_seconds"]
    planned = stages.planned or Mark(seconds, cpu, 0.0)
    rewritten = stages.rewritten or planned
    in_tasks = {name: sum(t.get(name, 0.0) for t in tasks) for name in TASK_PHASES}
    pyarrow_threads = rewritten.native_cpu_seconds - planned.native_cpu_seconds
    rewrite_cpu = rewritten.cpu_seconds - planned.cpu_seconds
    parts = {
        "plan": planned.cpu_seconds,
        **in_tasks,
        "pyarrow_threads": pyarrow_threads,
        "rewrite_other": rewrite_cpu - pyarrow_threads - sum(in_tasks.values()),
        "commit": cpu - rewritten.cpu_seconds,
    }
    files = max(phase["input_files"], 1)
    return {
        "seconds": {
            "plan": round(planned.seconds, 3),
            "rewrite": round(rewritten.seconds - planned.seconds, 3),
            "commit": round(seconds - rewritten.seconds, 3),
        },
        "cpu_seconds": {name: round(value, 3) for name, value in parts.items()},
        "cpu_ms_per_file": {
            **{name: round(value * 1000 / files, 4) for name, value in parts.items()},
            "total": round(cpu * 1000 / files, 4),
        },
    }


def compactor_phase(
    bench_table: BenchTable,
    target: str,
    allow_small_target: bool,
    parallelism: int | None = None,
    max_group_size: str | None = None,
    memory_limit: str | None = None,
) -> dict[str, Any]:
    """Compact ``bench_table`` with compactor's defaults and the options given, timing its
    stages and its tasks' phases (:func:`breakdown`)."""
    table = bench_table.load()
    options = resolve_options(
        bench_table.identifier,
        table.metadata.properties,
        target_file_size=target,
        allow_small_target=allow_small_target,
        parallelism=parallelism,
        max_group_size=max_group_size,
        memory_limit=memory_limit,
    )
    phase_times.enable()
    usage = PhaseUsage()
    stages = StageClock(make_executor(options.execution), usage.mark)
    try:
        result = compact(table, options, executor=stages)
    finally:
        stages.close()
    outputs = [d.file_size_in_bytes for r in result.committed for d in r.data_files]
    input_files = sum(len(g.files) for g in result.committed_groups)
    measured = usage.result(sum(r.input_bytes for r in result.committed), outputs, input_files)
    return {
        **measured,
        "groups": len(result.plan.groups),
        "parallelism": options.execution.parallelism,
        "max_group_size": options.plan.max_group_size,
        "memory_limit": options.execution.memory_limit,
        "records_written": sum(r.records_read for r in result.committed),
        "rows_deleted": sum(r.rows_deleted for r in result.committed),
        "bulk_read_files": sum(r.bulk_read_files for r in result.committed),
        "breakdown": breakdown(measured, stages, [r.phase_times for r in result.committed]),
    }


def conversion_phase(bench_table: BenchTable) -> dict[str, Any]:
    """Convert the equality deletes of ``bench_table`` into position deletes, as
    ``compactor rewrite-deletes`` would: only the key columns of the data files are read."""
    table = bench_table.load()
    usage = PhaseUsage()
    result = rewrite_deletes(table)
    seconds = usage.elapsed()
    assert result.equality_conversion is not None
    converted = result.equality_conversion.to_dict()
    return {
        "seconds": round(seconds, 3),
        **usage.resources(),
        "bytes_read": converted["key_bytes_read"],
        **{
            key: converted[key]
            for key in (
                "equality_delete_files_converted",
                "position_delete_files_written",
                "deletion_vectors_written",
                "data_files_read",
                "key_bytes_read",
                "rows_matched",
            )
        },
    }


def plan_phase(
    bench_table: BenchTable,
    target: str,
    allow_small_target: bool,
    memory_limit: str | None = None,
) -> dict[str, Any]:
    """Load ``bench_table``, then plan its compaction as a run under ``memory_limit`` does (the
    plan and the committer's context); the measures."""
    usage = PhaseUsage()
    table = bench_table.load()
    loaded = usage.elapsed()
    options = resolve_options(
        bench_table.identifier,
        table.metadata.properties,
        target_file_size=target,
        allow_small_target=allow_small_target,
        memory_limit=memory_limit,
    )
    result, context = plan_rewrite(table, bench_table.identifier, options.plan)
    total = usage.elapsed()
    return {
        "seconds": round(total, 3),
        "load_table_seconds": round(loaded, 3),
        "plan_seconds": round(total - loaded, 3),
        **usage.resources(),
        "manifests": len(context.start_manifests),
        "manifests_read": len(context.manifest_live_entries),
        "data_files_scanned": result.data_files_scanned,
        "max_candidate_files": options.plan.max_candidate_files,
        "deferred_files": result.deferred_files,
        "files_planned": result.input_files,
        "bytes_planned": result.input_bytes,
        "groups": len(result.groups),
    }


def scan_phase(bench_table: BenchTable) -> dict[str, Any]:
    """Load ``bench_table``, then plan a full scan with pyiceberg; the measures."""
    usage = PhaseUsage()
    table = bench_table.load()
    loaded = usage.elapsed()
    tasks = list(table.scan().plan_files())
    total = usage.elapsed()
    return {
        "load_table_seconds": round(loaded, 3),
        "plan_files_seconds": round(total - loaded, 3),
        **usage.resources(),
        "manifests": manifest_stats(table).total,
        "files": len(tasks),
    }


def manifests_phase(bench_table: BenchTable) -> dict[str, Any]:
    """Load ``bench_table``, then rewrite its manifests; the measures and the result."""
    usage = PhaseUsage()
    table = bench_table.load()
    loaded = usage.elapsed()
    result = rewrite_manifests(table)
    total = usage.elapsed()
    document = result.to_dict()
    return {
        "seconds": round(total - loaded, 3),
        **usage.resources(),
        **{
            key: document[key]
            for key in (
                "manifests_before",
                "manifests_after",
                "entries",
                "manifests_replaced",
                "manifests_written",
                "bytes_replaced",
                "bytes_written",
                "snapshot_id",
            )
        },
    }


def _spawn_pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))


def in_fresh_process(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run ``function(*args)`` in a new (spawned) process and return its result."""
    with _spawn_pool() as pool:
        return pool.submit(function, *args).result()


def _ready() -> int:
    """A no-op: run first in a fresh process, it has the process import this module."""
    return os.getpid()


def in_fresh_processes(
    function: Callable[..., dict[str, Any]], calls: Sequence[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    """Run ``function(*args)`` for each of ``calls`` at once, each in its own new process.

    The processes are started and have imported this module before any call begins, so the
    calls start together, not one process start-up apart.
    """
    pools = [_spawn_pool() for _ in calls]
    try:
        for started in [pool.submit(_ready) for pool in pools]:
            started.result()
        futures = [pool.submit(function, *args) for pool, args in zip(pools, calls, strict=True)]
        return [future.result() for future in futures]
    finally:
        for pool in pools:
            pool.shutdown()
