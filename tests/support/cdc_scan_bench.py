"""Scan times of a CDC table read by Iceberg Java: before any maintenance, after conversion,
after a full rewrite; and how many equality-delete files it takes for a scan to be slower
than after their conversion.

``store_sales`` is loaded as in ``compactor bench rewrite`` (TPC-DS, ~1 MB files, one a commit,
unpartitioned, ``--input-size`` bytes); then, for each count N of ``--delete-files``, starting
again from the loaded snapshot, 10% of its keys are deleted by equality deletes in N commits
(the same keys whatever N), the table is scanned, its deletes converted (``compactor
rewrite-deletes``: one position-delete file) and scanned again. Last, the table with the most
delete files is compacted (``compactor run``: the deletes applied) and scanned. Each scan is a
full read of every column by ``IcebergGenerics`` (``compactor.readcheck.ScanTimer`` in
``tests/support/java``, in a JVM of its own, the first scans warming it up), which applies
equality deletes as Iceberg Java does (DuckDB does not), reporting wall time and the JVM's CPU.

Usage, from ``tests/``::

    ../.venv/bin/python -m support.cdc_scan_bench --workdir /tmp/cdc-scans --out report.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

from compactor import api
from compactor.bench.report import machine
from compactor.bench.rewrite import TABLE, add_equality_deletes
from compactor.bench.tpcds import GENERATOR_FILE, NAMESPACE, generate, load_table
from compactor.bench.warehouse import Warehouse, open_warehouse
from compactor.sizes import parse_size

from support.java_reader import ensure_reader

SCAN_CLASS = "compactor.readcheck.ScanTimer"
JVM_OPTIONS = ("-Xmx1g", "-XX:+UseSerialGC")
DELETED_FRACTION = 0.1


def java_scan(metadata_location: str, scans: int) -> dict[str, Any]:
    """The last of ``scans`` full scans by Iceberg Java (the others warm the JVM up)."""
    reader = ensure_reader()
    command = [reader.java, *JVM_OPTIONS, "-cp", reader.classpath, SCAN_CLASS]
    done = subprocess.run(
        [*command, metadata_location, str(scans)],
        capture_output=True,
        text=True,
        check=True,
    )
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    return {**runs[-1], "all_seconds": [r["seconds"] for r in runs]}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(action: Any) -> tuple[Any, dict[str, float]]:
    cpu, started = _cpu_seconds(), time.perf_counter()
    result = action()
    spent = {"seconds": time.perf_counter() - started, "cpu_seconds": _cpu_seconds() - cpu}
    return result, {k: round(v, 3) for k, v in spent.items()}


def _reset(warehouse: Warehouse, snapshot_id: int) -> Any:
    table = warehouse.catalog().load_table(f"{NAMESPACE}.{TABLE}")
    table.manage_snapshots().set_current_snapshot(snapshot_id).commit()
    return warehouse.catalog().load_table(f"{NAMESPACE}.{TABLE}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    with open_warehouse(workdir) as warehouse:
        generator = generate(workdir / GENERATOR_FILE, args.scale_factor)
        table, loaded = load_table(
            generator,
            warehouse.catalog(),
            TABLE,
            parse_size(args.file_size),
            until_bytes=parse_size(args.input_size),
        )
        loaded_snapshot = table.current_snapshot()
        assert loaded_snapshot is not None
        report: dict[str, Any] = {
            "machine": machine(),
            "input": loaded.to_dict(),
            "no_deletes": java_scan(table.metadata_location, args.scans),
            "by_delete_files": [],
        }
        for files in args.delete_files:
            table = _reset(warehouse, loaded_snapshot.snapshot_id)
            deletes = add_equality_deletes(generator, table, DELETED_FRACTION, files)
            table = warehouse.catalog().load_table(f"{NAMESPACE}.{TABLE}")
            equality = java_scan(table.metadata_location, args.scans)
            converted, conversion = _timed(lambda: api.rewrite_deletes(table))  # noqa: B023
            table = warehouse.catalog().load_table(f"{NAMESPACE}.{TABLE}")
            position = java_scan(table.metadata_location, args.scans)
            assert equality["rows"] == position["rows"]
            report["by_delete_files"].append(
                {
                    "equality_delete_files": deletes["files"],
                    "keys": deletes["keys"],
                    "scan_equality_deletes": equality,
                    "conversion": {
                        **conversion,
                        "key_bytes_read": converted.equality_conversion.to_dict()["key_bytes_read"],
                        "position_delete_files": converted.delete_files_after,
                    },
                    "scan_after_conversion": position,
                }
            )
            print(json.dumps(report["by_delete_files"][-1]), flush=True)
        # The table with the most equality-delete files, compacted instead.
        table = _reset(warehouse, loaded_snapshot.snapshot_id)
        add_equality_deletes(generator, table, DELETED_FRACTION, max(args.delete_files))
        table = warehouse.catalog().load_table(f"{NAMESPACE}.{TABLE}")
        _, rewrite = _timed(
            lambda: api.compact(
                table, target_file_size=args.target_file_size, allow_small_target=True
            )
        )
        table = warehouse.catalog().load_table(f"{NAMESPACE}.{TABLE}")
        report["rewrite"] = rewrite
        report["scan_after_rewrite"] = java_scan(table.metadata_location, args.scans)
        generator.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scale-factor", type=float, default=1.0)
    parser.add_argument("--input-size", default="250MB")
    parser.add_argument("--file-size", default="1MB")
    parser.add_argument("--target-file-size", default="512MB")
    parser.add_argument("--scans", type=int, default=3)
    parser.add_argument(
        "--delete-files",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2, 4, 10, 30],
    )
    report = run(parser.parse_args())
    Path(parser.parse_args().out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
