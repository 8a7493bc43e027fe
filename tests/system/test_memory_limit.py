"""``--memory-limit``: a run's peak resident memory stays within 25% of the limit.

Each test compacts, in a ``compactor run`` subprocess, one group several times larger than
the limit, and reads the peak RSS the run reports (``peak_rss_bytes``: its ``VmHWM``; the
``ru_maxrss`` of ``wait4`` would count the test process it was forked from) — large files
streamed on the bulk path and read on the Iceberg path, many small files scanned together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

pytestmark = pytest.mark.slow  # left out by `make test-quick`

COMPACTOR = Path(sys.executable).parent / "compactor"
# Above the minimum (one worker), so that the buffers are what the limit sizes. A plan holds
# every input's manifest entry until its commit (~10-15 KB a file, metrics and all): the
# thousands of small files below take ~50 MiB of it.
LIMIT_MIB = 320
SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.float64()), ("c", pa.int64())])
ROW_BYTES = 24
LARGE_FILE_BYTES = 12 * 2**20  # too large to be scanned together with others


def _random_rows(rng: np.random.Generator, count: int) -> pa.Table:
    """Incompressible rows: what a file holds decoded is about what it stores."""
    return pa.table(
        {
            "a": rng.integers(0, 2**62, count),
            "b": rng.random(count),
            "c": rng.integers(0, 2**62, count),
        },
        schema=SCHEMA,
    )


def _large_files(catalog: SqlCatalog, files: int, seed: int) -> None:
    """db.m: ``files`` appends of LARGE_FILE_BYTES of random rows, a 1 GiB target (one group)."""
    rng = np.random.default_rng(seed)
    table = catalog.create_table(
        "db.m", SCHEMA, properties={"write.target-file-size-bytes": str(2**30)}
    )
    for _ in range(files):
        table.append(_random_rows(rng, LARGE_FILE_BYTES // ROW_BYTES))


def _compact(
    catalog: SqlCatalog, tmp_path: Path, limit_mib: int, *extra: str
) -> tuple[dict, float]:
    """``compactor run --memory-limit`` on db.m; its JSON result and its peak RSS in MiB."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYICEBERG_")}
    prefix = "PYICEBERG_CATALOG__DEFAULT__"
    env |= {
        prefix + "TYPE": "sql",
        prefix + "URI": catalog.properties["uri"],
        prefix + "WAREHOUSE": catalog.properties["warehouse"],
        "HOME": str(tmp_path),
    }
    command = [
        str(COMPACTOR),
        "run",
        "--catalog",
        "default",
        "--table",
        "db.m",
        "--memory-limit",
        f"{limit_mib}MiB",
        "--target-file-size",
        "512MiB",
        "--json",
        *extra,
    ]
    process = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,  # progress lines, on a slow machine
        text=True,
    )
    out, errors = process.communicate()
    assert process.returncode == 0, errors
    result = json.loads(out)
    return result, result["peak_rss_bytes"] / 2**20


@pytest.mark.parametrize("read", ["--bulk-read", "--no-bulk-read"])
def test_a_group_of_large_files_several_times_the_limit(
    catalog: SqlCatalog, tmp_path: Path, read: str
) -> None:
    """Streamed one at a time on the bulk path, read ahead in threads on the Iceberg path."""
    files, file_bytes = 72, LARGE_FILE_BYTES
    _large_files(catalog, files, seed=1)

    result, peak_mib = _compact(catalog, tmp_path, LIMIT_MIB, read)

    assert result["rewritten_files"] == files
    assert result["bulk_read_files"] == (files if read == "--bulk-read" else 0)
    assert files * file_bytes > 2.5 * LIMIT_MIB * 2**20
    print(f"peak {peak_mib:.0f} MiB")
    assert peak_mib <= 1.25 * LIMIT_MIB, f"peak {peak_mib:.0f} MiB"


def test_files_of_one_large_row_group_each_are_streamed(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    """A file written as one row group (as engines write 128 MB row groups) decodes to many
    times its size: read a batch at a time, not a row group at a time."""
    files, rows, columns = 3, 3_000_000, 8
    rng = np.random.default_rng(4)
    schema = pa.schema([(f"c{i}", pa.int64()) for i in range(columns)])
    table = catalog.create_table(
        "db.m",
        schema,
        properties={
            "write.target-file-size-bytes": str(2**30),
            "write.parquet.row-group-limit": str(rows),
        },
    )
    for _ in range(files):
        # Small values: a few bytes a row stored, 64 decoded.
        table.append(pa.table([rng.integers(0, 16, rows) for _ in range(columns)], schema=schema))
    data = table.inspect.files()
    decoded = rows * columns * 8

    result, peak_mib = _compact(catalog, tmp_path, LIMIT_MIB, "--min-input-files", str(files))

    assert result["rewritten_files"] == result["bulk_read_files"] == files
    assert decoded > max(0.5 * LIMIT_MIB * 2**20, 8 * max(data["file_size_in_bytes"].to_pylist()))
    print(f"peak {peak_mib:.0f} MiB")
    assert peak_mib <= 1.25 * LIMIT_MIB, f"peak {peak_mib:.0f} MiB"


def test_a_group_of_many_small_files_read_in_bulk(catalog: SqlCatalog, tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    rows_per_file = 4000  # ~100 KB per file
    batch = _random_rows(rng, rows_per_file)
    table = catalog.create_table(
        "db.m", SCHEMA, properties={"write.target-file-size-bytes": str(batch.nbytes)}
    )
    for _ in range(40):  # 100 files per commit
        table.append(_random_rows(rng, rows_per_file * 100))
    files = len(table.inspect.files())

    result, peak_mib = _compact(catalog, tmp_path, LIMIT_MIB)

    assert result["rewritten_files"] == result["bulk_read_files"] == files >= 4000
    assert files * rows_per_file * ROW_BYTES > LIMIT_MIB * 2**20
    print(f"peak {peak_mib:.0f} MiB")
    assert peak_mib <= 1.25 * LIMIT_MIB, f"peak {peak_mib:.0f} MiB"


def test_a_group_sorted_out_of_core(catalog: SqlCatalog, tmp_path: Path) -> None:
    files, file_bytes = 60, LARGE_FILE_BYTES
    _large_files(catalog, files, seed=3)

    result, peak_mib = _compact(
        catalog, tmp_path, LIMIT_MIB, "--strategy", "sort", "--sort-order", "a"
    )

    assert result["rewritten_files"] == files and result["strategy"] == "sort"
    assert files * file_bytes > 2 * LIMIT_MIB * 2**20
    print(f"peak {peak_mib:.0f} MiB")
    assert peak_mib <= 1.25 * LIMIT_MIB, f"peak {peak_mib:.0f} MiB"
