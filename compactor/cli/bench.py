"""``compactor bench``: the benchmark commands (heavy modules are imported inside them)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from compactor.cli.output import err, guarded

bench_app = typer.Typer(
    help="Benchmarks: TPC-DS queries before and after compaction; rewrite throughput.",
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
        print(json.dumps(report, indent=2))
    err.print("wrote " + ", ".join(str(p) for p in paths), markup=False, highlight=False)


@bench_app.command()
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

    def go() -> None:
        from compactor.bench.progress import QuietSteps, RichSteps
        from compactor.bench.query_benchmark import QueriesParameters, run_queries_benchmark
        from compactor.bench.report import build_report
        from compactor.bench.tpcds import parse_query_numbers
        from compactor.bench.warehouse import open_warehouse
        from compactor.errors import CompactorError, UsageError
        from compactor.options import resolve_options
        from compactor.sizes import parse_size

        if warmup < 0 or repetitions < 1:
            raise UsageError("--warmup must be 0 or more and --repetitions 1 or more")
        parameters = QueriesParameters(
            scale_factor=scale_factor,
            file_size=parse_size(file_size, "--file-size"),
            target_file_size=target_file_size,
            allow_small_target=allow_small_target,
            queries=parse_query_numbers(queries),
            warmup=warmup,
            repetitions=repetitions,
        )
        resolve_options(
            "tpcds", {}, target_file_size=target_file_size, allow_small_target=allow_small_target
        )
        steps = RichSteps(err) if err.is_terminal else QuietSteps()
        with (
            _workdir(workdir) as directory,
            open_warehouse(directory, s3=s3, s3_endpoint=s3_endpoint, bucket=s3_bucket) as wh,
        ):
            body = run_queries_benchmark(parameters, wh, directory, steps)
        settings = {**parameters.to_dict(), "storage": wh.storage, "s3_endpoint": s3_endpoint}
        report = build_report("queries", sys.argv, settings, body)
        _finish(report, out, as_json)
        different = [str(q["query"]) for q in body["queries"] if not q["identical_results"]]
        if different:
            raise CompactorError(
                f"{'query' if len(different) == 1 else 'queries'} {', '.join(different)}: "
                f"results differ before and after compaction (see {out / 'report.md'})"
            )

    guarded(go)


@bench_app.command()
def rewrite(
    input_size: Annotated[
        str, typer.Option(help="Data to compact: the table is loaded until it holds this much.")
    ] = "1GB",
    file_size: FileSizeOpt = "1MB",
    target_file_size: TargetOpt = "512MB",
    allow_small_target: AllowSmallOpt = False,
    scale_factor: Annotated[
        float,
        typer.Option(
            help="TPC-DS scale factor of the store_sales rows loaded (repeated as needed to "
            "reach --input-size)."
        ),
    ] = 1.0,
    equality_deletes: Annotated[
        float,
        typer.Option(
            help="Delete this fraction of store_sales' keys with equality deletes first (a CDC "
            "table); compactor applies them while rewriting, the floor does not."
        ),
    ] = 0.0,
    workdir: WorkdirOpt = None,
    out: OutOpt = Path("bench-report"),
    as_json: JsonOpt = False,
) -> None:
    """Compaction throughput on a fragmented table, beside a raw pyarrow floor on the same files.

    Loads TPC-DS store_sales as --file-size files (one per commit) until the table holds
    --input-size, then measures, each in a fresh process: the floor (plain pyarrow reading
    the files and writing target-size Parquet files with the same compression, no Iceberg)
    and compactor's rewrite of the table. Reports MB/s overall and per core, CPU time, peak
    RSS and output files, and compactor's MB/s as a fraction of the floor's.

    Example: compactor bench rewrite --input-size 1GB --file-size 1MB --out bench-rewrite

    A CDC table, 10% of its rows deleted by equality deletes:
    compactor bench rewrite --input-size 1GB --equality-deletes 0.1 --out bench-cdc
    """

    def go() -> None:
        from compactor.bench.progress import QuietSteps, RichSteps
        from compactor.bench.report import build_report
        from compactor.bench.rewrite import RewriteParameters, run_rewrite_benchmark
        from compactor.bench.warehouse import open_warehouse
        from compactor.errors import UsageError
        from compactor.options import resolve_options
        from compactor.sizes import parse_size

        parameters = RewriteParameters(
            scale_factor=scale_factor,
            input_size=parse_size(input_size, "--input-size"),
            file_size=parse_size(file_size, "--file-size"),
            target_file_size=target_file_size,
            allow_small_target=allow_small_target,
            equality_deletes=equality_deletes,
        )
        if parameters.input_size <= 0 or parameters.file_size <= 0:
            raise UsageError("--input-size and --file-size must be above 0")
        if not 0 <= equality_deletes < 1:
            raise UsageError(f"--equality-deletes {equality_deletes}: must be in [0, 1)")
        resolve_options(
            "tpcds", {}, target_file_size=target_file_size, allow_small_target=allow_small_target
        )
        steps = RichSteps(err) if err.is_terminal else QuietSteps()
        with _workdir(workdir) as directory, open_warehouse(directory) as wh:
            body = run_rewrite_benchmark(parameters, wh, directory, steps)
        _finish(build_report("rewrite", sys.argv, parameters.to_dict(), body), out, as_json)

    guarded(go)
