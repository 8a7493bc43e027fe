"""``compactor bench``: the benchmark commands (heavy modules are imported inside them)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from compactor.cli.output import err, guarded, print_json
from compactor.errors import UsageError

bench_app = typer.Typer(
    help="Benchmarks: TPC-DS queries before and after compaction; rewrite throughput; planning; manifests.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

DEFAULT_QUERIES = "25,31,49,76,77,80,88,96"

ScaleFactorOpt = Annotated[
    float, typer.Option(help="TPC-DS scale factor (1 = about 1 GB of raw data).")
]
FileSizeOpt = Annotated[
    str,
    typer.Option(help="Size of each file written while loading, e.g. 1MB, 256KB."),
]
TargetOpt = Annotated[str, typer.Option(help="Compaction target file size, 64MB..512MiB.")]
AllowSmallOpt = Annotated[
    bool,
    typer.Option(help="Allow a --target-file-size below 64MB (for small runs and tests)."),
]
WorkdirOpt = Annotated[
    Path | None,
    typer.Option(
        help="Directory for the generated data, catalog and local warehouse (kept after the "
        "run). Default: a temporary directory, removed at the end."
    ),
]
OutOpt = Annotated[
    Path, typer.Option(help="Directory for report.json, report.md (and chart.png for queries).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Also print report.json on stdout.")]
# The tiny files of the planning and manifest benchmarks.
RowsPerFileOpt = Annotated[int, typer.Option(help="Rows of store_sales in each file.")]
TinyScaleFactorOpt = Annotated[
    float,
    typer.Option(
        help="TPC-DS scale factor of the store_sales rows the files take (in turn, starting "
        "again when they run out)."
    ),
]
# What the bench extra brings beyond compactor's own dependencies (checked before a benchmark
# starts, not when its report is drawn at the end).
BENCH_EXTRA_MODULES = (
    "duckdb_extension_tpcds",
    "duckdb_extension_httpfs",
    "duckdb_extension_iceberg",
    "duckdb_extension_avro",
    "matplotlib",
    "moto",
)


def _require_bench_extra() -> None:
    """Fail with one line naming the extra when a module of it is missing."""
    missing = [m for m in BENCH_EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"compactor bench needs the bench extra: pip install 'compactor[bench]' "
            f"(missing: {', '.join(missing)})"
        )


@contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        yield path.resolve()
        return
    temporary = Path(tempfile.mkdtemp(prefix="compactor-bench-"))
    try:
        yield temporary
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _finish(report: dict[str, Any], out: Path, as_json: bool) -> None:
    from compactor.bench.report import write_reports

    paths = write_reports(report, out)
    if as_json:
        print_json(report)
    err.print("wrote " + ", ".join(str(p) for p in paths), markup=False, highlight=False)


def _run_on_local_warehouse(
    kind: str,
    run: Callable[..., dict[str, Any]],
    parameters: Any,
    workdir: Path | None,
    out: Path,
    as_json: bool,
) -> None:
    """Run a benchmark on a fresh local warehouse in ``workdir``; write its report to ``out``."""
    from compactor.bench.progress import LogSteps, RichSteps
    from compactor.bench.report import build_report
    from compactor.bench.warehouse import open_warehouse

    steps = RichSteps(err) if err.is_terminal else LogSteps(err)
    with _workdir(workdir) as directory, open_warehouse(directory) as wh:
        body = run(parameters, wh, directory, steps)
    _finish(build_report(kind, sys.argv, parameters.to_dict(), body), out, as_json)


@bench_app.command()
@guarded
def queries(
    scale_factor: ScaleFactorOpt = 1.0,
    file_size: FileSizeOpt = "1MB",
    target_file_size: TargetOpt = "512MB",
    allow_small_target: AllowSmallOpt = False,
    queries: Annotated[
        str,
        typer.Option(
            help="TPC-DS query numbers, comma-separated. The default is the eight I/O-heavy "
            "queries of the Amazon S3 Tables compaction study."
        ),
    ] = DEFAULT_QUERIES,
    warmup: Annotated[int, typer.Option(help="Untimed runs of each query first.")] = 1,
    repetitions: Annotated[
        int, typer.Option(help="Timed runs of each query; the median is reported.")
    ] = 3,
    workdir: WorkdirOpt = None,
    out: OutOpt = Path("bench-report"),
    s3: Annotated[
        str | None,
        typer.Option(
            help="'local': keep the tables in a moto S3 server started on 127.0.0.1 for the "
            "run, and count the GET requests it answers. Default: local disk."
        ),
    ] = None,
    s3_endpoint: Annotated[
        str | None,
        typer.Option(
            help="Keep the tables on this S3-compatible endpoint (e.g. http://localhost:9000), "
            "with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION from the environment; "
            "GET requests are counted from DuckDB's HTTP log. Default: local disk."
        ),
    ] = None,
    s3_bucket: Annotated[
        str,
        typer.Option(
            help="Bucket for --s3/--s3-endpoint (created if missing; the run's prefix is "
            "deleted at the end)."
        ),
    ] = "compactor-bench",
    s3_latency: Annotated[
        str | None,
        typer.Option(
            help="With --s3 local: answer every request this late (e.g. 30ms), emulating the "
            "time to first byte of an object store. Default: none (loopback speed)."
        ),
    ] = None,
    strategy: Annotated[
        str | None,
        typer.Option(
            help="Compact the fact tables with this strategy: binpack, sort (by date key, "
            "then item key) or zorder (on both), and also run four filtered queries on "
            "those columns (901-904), reporting the files and row groups min/max statistics "
            "let a reader skip. Default: bin-pack, the study's queries only."
        ),
    ] = None,
    row_group_size: Annotated[
        str | None,
        typer.Option(
            help="Set every table's write.parquet.row-group-size-bytes to this (e.g. 4MiB) "
            "before compacting it, as for tables read with selective filters or joins: "
            "smaller row groups let DuckDB skip more by their min/max statistics, at some "
            "cost in size. Default: the table's (unset: 128 MiB, capped by the memory limit)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """TPC-DS queries in DuckDB over fragmented Iceberg tables, before and after compaction.

    Generates TPC-DS with DuckDB's dsdgen, loads the tables the queries read into Iceberg as a
    streaming writer leaves them (one --file-size file per commit), runs the queries over each
    table's current snapshot, compacts every table with compactor, runs them again, checks
    the results are identical and writes report.json, report.md and chart.png to --out.
    Exit 1 when a query's results differ after compaction.

    Example: compactor bench queries --scale-factor 1 --file-size 1MB --out bench-report
    """
    _require_bench_extra()
    from compactor.bench.clustering import strategy_options
    from compactor.bench.progress import LogSteps, RichSteps
    from compactor.bench.query_benchmark import QueriesParameters, run_queries_benchmark
    from compactor.bench.report import build_report
    from compactor.bench.tpcds import parse_query_numbers
    from compactor.bench.warehouse import open_warehouse
    from compactor.durations import parse_duration_ms
    from compactor.errors import CompactorError, UsageError
    from compactor.options import resolve_options
    from compactor.rewrite.parquet_output import MIN_ROW_GROUP_BYTES
    from compactor.sizes import format_size, parse_size

    if warmup < 0 or repetitions < 1:
        raise UsageError("--warmup must be 0 or more and --repetitions 1 or more")
    latency_ms = parse_duration_ms(s3_latency, "--s3-latency") if s3_latency else 0
    row_group = parse_size(row_group_size, "--row-group-size") if row_group_size else None
    if row_group is not None and row_group < MIN_ROW_GROUP_BYTES:
        raise UsageError(
            f"--row-group-size {row_group_size}: must be at least "
            f"{format_size(MIN_ROW_GROUP_BYTES)}"
        )
    parameters = QueriesParameters(
        scale_factor=scale_factor,
        file_size=parse_size(file_size, "--file-size"),
        target_file_size=target_file_size,
        allow_small_target=allow_small_target,
        queries=parse_query_numbers(queries),
        warmup=warmup,
        repetitions=repetitions,
        strategy=strategy,
        row_group_size=row_group,
    )
    resolve_options(
        "tpcds",
        {},
        target_file_size=target_file_size,
        allow_small_target=allow_small_target,
        **strategy_options(strategy or "binpack", "store_sales"),
    )
    steps = RichSteps(err) if err.is_terminal else LogSteps(err)
    with (
        _workdir(workdir) as directory,
        open_warehouse(
            directory,
            s3=s3,
            s3_endpoint=s3_endpoint,
            bucket=s3_bucket,
            s3_latency_s=latency_ms / 1000,
        ) as wh,
    ):
        body = run_queries_benchmark(parameters, wh, directory, steps)
    settings = {
        **parameters.to_dict(),
        "storage": wh.storage,
        "s3_endpoint": s3_endpoint,
        "s3_latency_ms": latency_ms,
    }
    report = build_report("queries", sys.argv, settings, body)
    _finish(report, out, as_json)
    different = [str(q["query"]) for q in body["queries"] if not q["identical_results"]]
    if different:
        raise CompactorError(
            f"{'query' if len(different) == 1 else 'queries'} {', '.join(different)}: "
            f"results differ before and after compaction (see {out / 'report.md'})"
        )


@bench_app.command()
@guarded
def rewrite(
    workload: Annotated[
        str | None,
        typer.Option(
            help="A preset input: 'large' = store_sales at scale factor 3, unpartitioned, "
            "loaded once as 3,000 files, one per commit; 'tiny' = store_sales at scale factor "
            "0.3 as 10,000 files of ~12 KB, 50 per commit over 200 commits. Both target 512MB. "
            "--scale-factor, --files, --commits and --target-file-size override the preset; "
            "--input-size and --file-size are refused with it. Default: none (load by size)."
        ),
    ] = None,
    input_size: Annotated[
        str | None,
        typer.Option(
            help="Load by size: the table is loaded until it holds this much. Default: 1GB "
            "(without --workload/--files)."
        ),
    ] = None,
    file_size: Annotated[
        str | None,
        typer.Option(
            help="Load by size: size of each file written, one per commit, e.g. 1MB, 256KB. "
            "Default: 1MB (without --workload/--files)."
        ),
    ] = None,
    files: Annotated[
        int | None,
        typer.Option(
            help="Load by count: the generated rows once, as this many files of equal rows. "
            "Default: the workload's."
        ),
    ] = None,
    commits: Annotated[
        int | None,
        typer.Option(
            help="Load by count: in this many commits of equal file counts. Default: the "
            "workload's files per commit, or one file per commit."
        ),
    ] = None,
    target_file_size: Annotated[
        str | None,
        typer.Option(help="Compaction target file size, 64MB..512MiB. Default: 512MB."),
    ] = None,
    allow_small_target: AllowSmallOpt = False,
    scale_factor: Annotated[
        float | None,
        typer.Option(
            help="TPC-DS scale factor of the store_sales rows loaded (by size: repeated as "
            "needed to reach --input-size). Default: 1, or the workload's."
        ),
    ] = None,
    parallelism: Annotated[
        int | None,
        typer.Option(
            help="compactor's --parallelism (groups rewritten at once) in its phase. Default: "
            "one per core. An unpartitioned table is one group, cut in two while workers "
            "would idle once it holds two target files' worth, or by --max-group-size."
        ),
    ] = None,
    max_group_size: Annotated[
        str | None,
        typer.Option(
            help="compactor's --max-group-size in its phase (at least the target file size): "
            "a table larger than it is rewritten as several groups, --parallelism at once."
        ),
    ] = None,
    memory_limit: Annotated[
        str | None,
        typer.Option(
            help="compactor's --memory-limit in its phase (default compactor's, 384MiB): with "
            "--parallelism, what each worker's buffers get."
        ),
    ] = None,
    equality_deletes: Annotated[
        float,
        typer.Option(
            help="Delete this fraction of store_sales' keys with equality deletes first (a CDC "
            "table); compactor applies them while rewriting, the floor does not. A conversion "
            "phase first converts them into position deletes (as rewrite-deletes does), then "
            "the table is put back as it was, so both remedies are measured."
        ),
    ] = 0.0,
    imported: Annotated[
        bool,
        typer.Option(
            help="Write the loaded files again without Iceberg field ids and register them "
            "with add_files in a table of the same name, as a migration leaves a table: "
            "compactor reads them through the table's name mapping."
        ),
    ] = False,
    workdir: WorkdirOpt = None,
    out: OutOpt = Path("bench-report"),
    as_json: JsonOpt = False,
) -> None:
    """Compaction throughput on a fragmented table, beside a raw pyarrow floor on the same files.

    Loads TPC-DS store_sales by size (--file-size files, one per commit, until the table
    holds --input-size) or by count (--workload, or --files in --commits commits), then
    measures, one after the other and each in fresh processes: the floor in 1 process (plain
    pyarrow reading the files and writing target-size Parquet files with the same compression,
    no Iceberg), the floor in 2 processes at once (each half of the files, by bytes, in its
    own process), and compactor's rewrite of the table. Reports seconds, MB/s, files/s, CPU
    time, peak RSS and output files of each, and compactor's time as a multiple of each
    floor's.

    Example: compactor bench rewrite --workload large --out bench-large

    The tiny-files workload: compactor bench rewrite --workload tiny --out bench-tiny

    A scaling run (four groups of at most 128MB, two at once):
    compactor bench rewrite --workload large --target-file-size 128MB --max-group-size 128MB
    --parallelism 2 --out bench-large-p2

    By size, as before: compactor bench rewrite --input-size 1GB --file-size 1MB

    The same rows as a migrated table (files without field ids, added by add_files):
    compactor bench rewrite --workload tiny --imported --out bench-tiny-imported

    A CDC table, 10% of its rows deleted by equality deletes:
    compactor bench rewrite --input-size 1GB --equality-deletes 0.1 --out bench-cdc
    """
    _require_bench_extra()
    from compactor.bench.rewrite import rewrite_parameters, run_rewrite_benchmark

    parameters = rewrite_parameters(
        workload=workload,
        scale_factor=scale_factor,
        input_size=input_size,
        file_size=file_size,
        files=files,
        commits=commits,
        target_file_size=target_file_size,
        allow_small_target=allow_small_target,
        equality_deletes=equality_deletes,
        parallelism=parallelism,
        max_group_size=max_group_size,
        memory_limit=memory_limit,
        imported=imported,
    )
    _run_on_local_warehouse("rewrite", run_rewrite_benchmark, parameters, workdir, out, as_json)


@bench_app.command()
@guarded
def plan(
    files: Annotated[int, typer.Option(help="Data files in the table.")] = 100_000,
    commits: Annotated[
        int, typer.Option(help="Commits (fast appends) they are spread over, equally.")
    ] = 1_000,
    rows_per_file: RowsPerFileOpt = 10,
    scale_factor: TinyScaleFactorOpt = 0.01,
    repetitions: Annotated[
        int,
        typer.Option(help="Planning runs, each in a fresh process; the median is reported."),
    ] = 3,
    distinct_files: Annotated[
        int | None,
        typer.Option(
            help="Parquet files actually written; the others are hard links to them in turn "
            "(same bytes and metrics), which builds a million-file table in minutes. "
            "Default: every file written."
        ),
    ] = None,
    target_file_size: TargetOpt = "512MB",
    allow_small_target: AllowSmallOpt = False,
    memory_limit: Annotated[
        str | None,
        typer.Option(
            help="compactor's --memory-limit for planning (default compactor's, 384MiB): "
            "candidates past its budget are left for a next run."
        ),
    ] = None,
    workdir: WorkdirOpt = None,
    out: OutOpt = Path("bench-report"),
    as_json: JsonOpt = False,
) -> None:
    """Planning time on a table of many tiny files over many commits.

    Builds TPC-DS store_sales as --files Parquet files (every one a real file with the
    Iceberg field ids and column metrics) over --commits fast-append commits, one manifest
    each, as fast as the machine allows (a writer process per core; the snapshots go to the
    catalog in batches), then times compactor's planning of it (compactor.plan: the manifest
    list and every manifest read, candidates picked, groups packed; nothing written) in a
    fresh process, --repetitions times. Reports the seconds to load the table and to plan,
    CPU, peak RSS, manifests read and files planned.

    Example: compactor bench plan --files 100000 --commits 1000 --out bench-plan

    A million files, a tenth of them written:
    compactor bench plan --files 1000000 --commits 1000 --distinct-files 100000
    """
    _require_bench_extra()
    from compactor.bench.planning import plan_parameters, run_plan_benchmark

    parameters = plan_parameters(
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
    _run_on_local_warehouse("plan", run_plan_benchmark, parameters, workdir, out, as_json)


@bench_app.command()
@guarded
def manifests(
    commits: Annotated[
        int, typer.Option(help="Fast appends of one file each: the manifests before.")
    ] = 5_000,
    rows_per_file: RowsPerFileOpt = 10,
    scale_factor: TinyScaleFactorOpt = 0.01,
    repetitions: Annotated[
        int,
        typer.Option(
            help="Scan plannings before and after, pyiceberg's and DuckDB's, each in a fresh "
            "process (median)."
        ),
    ] = 3,
    workdir: WorkdirOpt = None,
    out: OutOpt = Path("bench-report"),
    as_json: JsonOpt = False,
) -> None:
    """What rewriting manifests buys a table of many one-file commits.

    Builds TPC-DS store_sales as --commits fast appends of one Parquet file each (one manifest
    per commit, as bench plan builds it), then times pyiceberg's scan planning
    (table.scan().plan_files()) and DuckDB's (EXPLAIN and count(*) through iceberg_scan,
    with the iceberg extension of the PyPI package duckdb-extension-iceberg),
    compactor.rewrite_manifests(table), and both scan plannings again, each in a fresh process.
    Reports the manifests before and after, the rewrite's time, and the median planning times
    before and after.

    Example: compactor bench manifests --commits 10000 --out bench-manifests
    """
    _require_bench_extra()
    from compactor.bench.manifests import manifest_parameters, run_manifest_benchmark

    parameters = manifest_parameters(
        commits=commits,
        rows_per_file=rows_per_file,
        scale_factor=scale_factor,
        repetitions=repetitions,
    )
    _run_on_local_warehouse("manifests", run_manifest_benchmark, parameters, workdir, out, as_json)
