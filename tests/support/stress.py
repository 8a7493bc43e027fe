"""The stress writer (stress_writer.py) started as a process, and its log read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog

from compactor.bench.sample import events_batch

from support import REPOSITORY
from support.stress_writer import DAYS, ROWS_PER_BATCH

TABLE = "db.stress"
INITIAL_COMMITS = 4
INITIAL_ROWS = 240
WRITER = Path(__file__).with_name("stress_writer.py")
SEED = int(os.environ.get("STRESS_SEED", "20260101"))


def start_writer(catalog: Catalog, ops: int, log: Path, stderr: Any) -> subprocess.Popen[str]:
    database = catalog.properties["uri"].removeprefix("sqlite:///")
    env = dict(os.environ)
    root = str(REPOSITORY)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    command = [
        sys.executable,
        str(WRITER),
        database,
        catalog.properties["warehouse"],
        TABLE,
        str(ops),
        str(SEED),
        str(log),
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)


def read_log(log: Path, initial_ids: set[int], ops: int) -> tuple[list[int], set[int]]:
    """The appended batches and the deleted ids, checking the log is consistent in itself."""
    alive = set(initial_ids)
    batches: list[int] = []
    deleted: set[int] = set()
    entries = log.read_text().splitlines()
    assert len(entries) == ops, f"the writer logged {len(entries)} operations, not {ops}"
    for number, line in enumerate(entries):
        entry = json.loads(line)
        ids = entry["ids"]
        assert len(set(ids)) == len(ids), f"log line {number}: repeated ids"
        if entry["op"] == "append":
            expected = events_batch(entry["batch"], ROWS_PER_BATCH, DAYS)["event_id"].to_pylist()
            assert ids == expected, f"log line {number}: batch {entry['batch']} has other ids"
            assert not alive & set(ids) and not deleted & set(ids), f"log line {number}: ids reused"
            alive.update(ids)
            batches.append(entry["batch"])
        else:
            assert entry["op"] == "delete"
            assert set(ids) <= alive, f"log line {number}: deletes ids that were not live"
            alive.difference_update(ids)
            deleted.update(ids)
    return batches, deleted
