"""Rewrite throughput with the thread executor and with Ray on local clusters; not a test.

``compactor bench rewrite`` runs the default executor only, so this script measures the
executors on the same input, built the same way (TPC-DS ``store_sales``, one ~``--file-size``
file per commit, with ``compactor.bench``'s generator and loader), in a local warehouse:

    .venv/bin/python tests/support/bench_ray.py --input-size 256MB --file-size 1MB \\
        --target-file-size 32MB --max-group-size 32MB --workers 1,2,4 --out bench-ray.json

Each configuration compacts the same snapshot (the table is rolled back to it before each run):
threads with ``--parallelism`` 1 and 2, then Ray clusters of a head node that runs no task and
1, 2 or 4 worker nodes of one CPU each (tests/support/ray_cluster.py), ``parallelism=None`` (Ray
schedules by resources). Every Ray configuration runs twice on its cluster: cold (worker
processes start and import compactor) and warm. Planning and committing are timed by wrapping
``compactor.compaction.plan_rewrite`` and ``commit_replace``; catalog round trips are counted
on the SQL catalog class.

``--many-files N`` adds a planning/commit scaling run on a synthetic table of N tiny files in
N/20 partitions (20 files each), written in 20 commits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

import compactor.compaction as compaction
from compactor.bench.tpcds import GENERATOR_FILE, NAMESPACE, generate, load_table
from compactor.bench.warehouse import open_warehouse
from compactor.execute.executors import Executor, ThreadExecutor
from compactor.execute.ray_executor import RayExecutor
from compactor.options import resolve_options
from compactor.sizes import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for ``support``

from support.ray_cluster import ray_cluster  # noqa: E402

MB = 10**6
TABLE = "store_sales"


class Timers:
    """Seconds spent in planning, committing and catalog calls of the runs made meanwhile."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - started
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def reset(self) -> None:
        self.spent.clear()
        self.calls.clear()


@contextmanager
def timed(timers: Timers) -> Iterator[None]:
    """Time plan_rewrite and commit_replace as compact_table() calls them, and catalog calls."""
    originals = {
        (compaction, "plan_rewrite"): compaction.plan_rewrite,
        (compaction, "commit_replace"): compaction.commit_replace,
        (SqlCatalog, "load_table"): SqlCatalog.load_table,
        (SqlCatalog, "commit_table"): SqlCatalog.commit_table,
    }
    for (owner, name), function in originals.items():
        setattr(owner, name, timers.wrap(name, function))
    try:
        yield
    finally:
        for (owner, name), function in originals.items():
            setattr(owner, name, function)


def run_once(
    table: Table, start: int, options_kwargs: dict[str, Any], executor: Executor, timers: Timers
) -> dict[str, Any]:
    """Roll ``table`` back to snapshot ``start`` and compact it with ``executor``."""
    table.manage_snapshots().set_current_snapshot(start).commit()
    identifier = f"{NAMESPACE}.{TABLE}"
    options = resolve_options(identifier, table.metadata.properties, **options_kwargs)
    timers.reset()
    with timed(timers):
        started = time.perf_counter()
        result = compaction.compact_table(table, options, executor=executor)
        seconds = time.perf_counter() - started
    document = result.to_dict()
    assert not document["failed_groups"], document["failed_groups"]
    rewritten = document["rewritten_bytes"]
    return {
        "seconds": round(seconds, 2),
        "mb_per_s": round(rewritten / MB / seconds, 1),
        "groups": document["groups"],
        "input_files": document["rewritten_files"],
        "input_mb": round(rewritten / MB, 1),
        "output_files": document["added_files"],
        "plan_s": round(timers.spent.get("plan_rewrite", 0.0), 3),
        "commit_s": round(timers.spent.get("commit_replace", 0.0), 3),
        "commits": timers.calls.get("commit_replace", 0),
        "catalog_load_table_calls": timers.calls.get("load_table", 0),
        "catalog_commit_table_calls": timers.calls.get("commit_table", 0),
    }


def worker_peak_rss(pids: list[int]) -> int:
    """The highest peak RSS (VmHWM) of the Ray task workers among ``pids``."""
    peak = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        name = fields.get("Name", "").strip()  # ray::IDLE, ray::compactor ...; agents aside
        agent = name.startswith(("ray::Dashboard", "ray::RuntimeEnv"))
        if name.startswith("ray::") and not agent and "VmHWM" in fields:
            peak = max(peak, int(fields["VmHWM"].split()[0]) * 1024)
    return peak


def executors_benchmark(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    timers = Timers()
    options = {
        "target_file_size": args.target_file_size,
        "allow_small_target": True,
        "max_group_size": args.max_group_size,
        "min_input_files": 2,
    }
    with open_warehouse(workdir / "wh") as warehouse:
        generator = generate(workdir / GENERATOR_FILE, args.scale_factor)
        try:
            table, loaded = load_table(
                generator,
                warehouse.catalog(),
                TABLE,
                parse_size(args.file_size, "--file-size"),
                until_bytes=parse_size(args.input_size, "--input-size"),
            )
        finally:
            generator.close()
        results["input"] = loaded.to_dict()
        snapshot = table.current_snapshot()
        assert snapshot is not None
        start = snapshot.snapshot_id
        for parallelism in (1, 2):
            executor = ThreadExecutor(parallelism)
            run = run_once(table, start, {**options, "parallelism": parallelism}, executor, timers)
            results[f"threads-{parallelism}"] = run
            print(f"threads parallelism {parallelism}: {run}", flush=True)
        for workers in args.workers:
            with (
                ray_cluster(workers=workers, head_cpus=0) as cluster,
                RayExecutor(cluster.address) as executor,
            ):
                for phase in ("cold", "warm"):
                    run = run_once(table, start, options, executor, timers)
                    run["worker_peak_rss_mb"] = round(worker_peak_rss(cluster.processes()) / MB)
                    results[f"ray-{workers}-{phase}"] = run
                    print(f"ray {workers} workers, {phase}: {run}", flush=True)
    return results


def many_files_benchmark(files: int, workdir: Path) -> dict[str, Any]:
    """Plan and commit costs on ``files`` tiny files: 20 commits of files/20 partitions each."""
    partitions, commits = files // 20, 20
    catalog = SqlCatalog(
        "many",
        uri=f"sqlite:///{workdir / 'many.db'}",
        warehouse=(workdir / "many-wh").as_uri(),
    )
    (workdir / "many-wh").mkdir(exist_ok=True)
    catalog.create_namespace("db")
    schema = Schema(
        NestedField(1, "part", LongType(), required=False),
        NestedField(2, "value", StringType(), required=False),
    )
    spec = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "part"))
    table = catalog.create_table("db.many", schema, partition_spec=spec)
    started = time.perf_counter()
    for commit in range(commits):
        rows = pa.table(
            {
                "part": pa.array(range(partitions), pa.int64()),
                "value": pa.array([f"c{commit}-p{p}" for p in range(partitions)]),
            }
        )
        table.append(rows)
    load_s = time.perf_counter() - started
    options = resolve_options(
        "db.many", {}, target_file_size="1MiB", allow_small_target=True, parallelism=2
    )
    timers = Timers()
    with timed(timers):
        started = time.perf_counter()
        result = compaction.compact_table(table, options)
        seconds = time.perf_counter() - started
    document = result.to_dict()
    assert not document["failed_groups"]
    return {
        "files": document["rewritten_files"],
        "partitions": partitions,
        "commits_loaded": commits,
        "load_s": round(load_s, 1),
        "groups": document["groups"],
        "run_s": round(seconds, 2),
        "plan_s": round(timers.spent["plan_rewrite"], 3),
        "plan_ms_per_file": round(1000 * timers.spent["plan_rewrite"] / files, 4),
        "commit_s": round(timers.spent["commit_replace"], 3),
        "commit_entries": document["rewritten_files"] + document["added_files"],
        "commit_ms_per_entry": round(
            1000
            * timers.spent["commit_replace"]
            / (document["rewritten_files"] + document["added_files"]),
            4,
        ),
        "catalog_load_table_calls": timers.calls.get("load_table", 0),
        "catalog_commit_table_calls": timers.calls.get("commit_table", 0),
    }


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as meminfo:
        total_kb = int(meminfo.readline().split()[1])
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "memory_gib": round(total_kb / 1024**2, 1),
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-size", default="256MB")
    parser.add_argument("--file-size", default="1MB")
    parser.add_argument("--target-file-size", default="32MB")
    parser.add_argument("--max-group-size", default="32MB")
    parser.add_argument("--scale-factor", type=float, default=1.0)
    parser.add_argument("--workers", default="1,2,4", type=lambda s: [int(w) for w in s.split(",")])
    parser.add_argument("--many-files", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-ray.json"))
    args = parser.parse_args()
    import ray

    workdir = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    try:
        report: dict[str, Any] = {"machine": machine(), "ray": ray.__version__}
        report["parameters"] = {k: str(v) for k, v in vars(args).items()}
        report["executors"] = executors_benchmark(args, workdir)
        if args.many_files:
            report["many_files"] = many_files_benchmark(args.many_files, workdir)
            print(f"many files: {report['many_files']}", flush=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
