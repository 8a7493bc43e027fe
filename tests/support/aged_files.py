"""A small table's schema and rows, and files of chosen ages under a table's location."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from compactor.durations import DAY_MS

from support.tables import local_path

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "v", StringType(), required=False),
)
NOW_MS = int(time.time() * 1000)  # the suite's "now": file ages are set relative to it
OLD_MS = NOW_MS - 10 * DAY_MS  # well past the default three-day grace period


def batch(start: int, rows: int = 40) -> pa.Table:
    ids = range(start, start + rows)
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "v": pa.array([f"r{i}" for i in ids], pa.string())}
    )


def root(table: Table) -> Path:
    return local_path(table.metadata.location)


def set_mtime(paths: Iterable[Path], ms: int) -> None:
    for path in paths:
        os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000), follow_symlinks=False)


def age_everything(directory: Path, ms: int = OLD_MS) -> None:
    """Make every file under ``directory`` old: only references may protect them now."""
    set_mtime((p for p in directory.rglob("*") if p.is_file()), ms)


def junk(path: Path, size: int = 100, ms: int | None = OLD_MS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"j" * size)
    if ms is not None:
        set_mtime([path], ms)
    return path


def listing(directory: Path) -> dict[str, int]:
    """Every file (or symlink) under ``directory`` with its size."""
    return {
        str(p): p.lstat().st_size for p in directory.rglob("*") if p.is_file() or p.is_symlink()
    }
