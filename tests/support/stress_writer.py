"""The writer side of the stress test: a separate process that appends and deletes rows.

    python stress_writer.py CATALOG_DB WAREHOUSE_URI TABLE OPS SEED LOG_PATH

Performs ``OPS`` operations, chosen pseudo-randomly with ``SEED``, on the events table:

- append: a batch of new rows with ids no one has used (``events_batch`` of a fresh number);
- cow-delete: a copy-on-write delete (``table.delete``) of a range of ids that are all live;
- pos-delete: a merge-on-read position delete of a few live rows of one live data file.

An operation whose commit fails on a conflict (the head moved, or pyiceberg's validation
refused it) is retried from scratch after a refresh, at most ``MAX_ATTEMPTS`` times. Only once
an operation has committed is it appended to the log, one JSON object a line, flushed:
``{"op": "append", "batch": 1000, "ids": [...]}``, ``{"op": "delete", "kind": ..., "ids": [...]}``.

The writer keeps its own model of the live ids and checks the table against it: before every
operation, the ids of the whole current snapshot (whatever compactions committed meanwhile);
before every delete attempt, the rows it is about to delete, in the snapshot it deletes from.
A row lost or resurrected by a compaction fails the writer there, before a later delete could
hide it. These scans are also the "work per op" that leaves compactions time to commit between
the writer's commits (no sleeps).

On stdout: ``ready`` after its first operation has committed, ``committed N`` after each later
one, and a JSON object of counts at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from compactor.bench.sample import events_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for ``support``

from support.deletes import commit_delete_files, write_position_delete_file  # noqa: E402
from support.tables import live_data_files, read_data_file  # noqa: E402

# Appended batches are numbered from here (the test's initial commits use lower numbers).
FIRST_BATCH = 1000
ROWS_PER_BATCH = 96
DAYS = 3
MAX_ATTEMPTS = 50
MAX_RANGE = 40
MAX_POSITIONS = 5
# Relative weights of the operations.
WEIGHTS = {"append": 4, "cow-delete": 3, "pos-delete": 3}
CONFLICTS = (CommitFailedException, ValidationException)


class Diverged(Exception):
    """The table does not hold what this writer committed."""


class GaveUp(Exception):
    """An operation kept conflicting for ``MAX_ATTEMPTS`` attempts."""


class Writer:
    def __init__(self, table: Table, rng: random.Random, log: TextIO) -> None:
        self.table, self.rng, self.log = table, rng, log
        self.alive: set[int] = set(
            table.scan(selected_fields=("event_id",)).to_arrow()["event_id"].to_pylist()
        )
        self.next_batch = FIRST_BATCH
        self.counts: dict[str, Any] = {"append": 0, "cow-delete": 0, "pos-delete": 0, "retries": 0}
        self.counts["conflicts"] = {}
        self.target: str | None = None  # the data file a position delete is retried on

    # -- bookkeeping ------------------------------------------------------------------------

    def _record(self, entry: dict[str, Any]) -> None:
        self.log.write(json.dumps(entry) + "\n")
        self.log.flush()

    def _conflict(self, op: str, exc: BaseException) -> None:
        self.counts["retries"] += 1
        name = f"{op}: {type(exc).__name__}"
        self.counts["conflicts"][name] = self.counts["conflicts"].get(name, 0) + 1
        self.table.refresh()

    # -- operations -------------------------------------------------------------------------

    def check_table(self) -> None:
        """The table holds exactly the ids this writer committed and did not delete, once each.

        Compactions change files, never content: whatever snapshot is current, this must hold.
        """
        found = self.table.scan(selected_fields=("event_id",)).to_arrow()["event_id"].to_pylist()
        if len(found) != len(self.alive) or set(found) != self.alive:
            counts = Counter(found)
            raise Diverged(
                f"snapshot {self.table.current_snapshot().snapshot_id}: "
                f"missing {sorted(self.alive - counts.keys())[:20]}, "
                f"unexpected {sorted(counts.keys() - self.alive)[:20]}, "
                f"repeated {sorted(i for i, n in counts.items() if n > 1)[:20]}"
            )

    def run_op(self, op: str) -> None:
        handler = {
            "append": self.append,
            "cow-delete": self.cow_delete,
            "pos-delete": self.pos_delete,
        }[op]
        for _ in range(MAX_ATTEMPTS):
            try:
                done = handler()
            except CONFLICTS as exc:
                self._conflict(op, exc)
                continue
            if not done:  # nothing to delete: append instead
                self.run_op("append")
                return
            self.counts[done] += 1
            return
        raise GaveUp(f"{op}: still conflicting after {MAX_ATTEMPTS} attempts")

    def append(self) -> str:
        batch = events_batch(self.next_batch, ROWS_PER_BATCH, DAYS)
        ids = batch["event_id"].to_pylist()
        assert not self.alive & set(ids), "batch ids collide with live ids"
        self.table.append(batch)
        self.alive.update(ids)
        self._record({"op": "append", "batch": self.next_batch, "ids": ids})
        self.next_batch += 1
        return "append"

    def _live_run(self) -> list[int]:
        """Consecutive ids, all live, starting at a random live id."""
        ordered = sorted(self.alive)
        start = self.rng.randrange(len(ordered))
        length = self.rng.randint(1, MAX_RANGE)
        run = [ordered[start]]
        while len(run) < length and run[-1] + 1 in self.alive:
            run.append(run[-1] + 1)
        return run

    def _check_live(self, where: str, ids: list[int]) -> None:
        """The rows ``where`` selects are exactly ``ids``, each once, as this writer committed.

        Reads the snapshot the delete will be based on: compactions must never change what a
        snapshot holds, so a row lost or resurrected shows here before a delete could hide it.
        """
        found = self.table.scan(row_filter=where, selected_fields=("event_id",)).to_arrow()
        found_ids = sorted(found["event_id"].to_pylist())
        if found_ids != sorted(ids):
            raise Diverged(f"before deleting {where}: the table holds {found_ids}, not {ids}")

    def cow_delete(self) -> str | None:
        if not self.alive:
            return None
        run = self._live_run()
        low, high = run[0], run[-1] + 1
        where = f"event_id >= {low} and event_id < {high}"
        self._check_live(where, run)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.table.delete(where)
        unmatched = [w for w in caught if "did not match any records" in str(w.message)]
        if unmatched:
            raise Diverged(f"{where} matched no rows in the table, though the scan found {run}")
        self.alive.difference_update(run)
        self._record({"op": "delete", "kind": "cow", "ids": run})
        return "cow-delete"

    def _pick_rows(self) -> tuple[DataFile, list[int], list[int]] | None:
        """A live data file and a few of its positions holding live ids (and those ids).

        After a conflict the file tried before is kept if it is still live; if a compaction or
        a copy-on-write delete removed it, another is picked.
        """
        files = live_data_files(self.table)
        candidates = sorted(files)
        self.rng.shuffle(candidates)
        if self.target in files:  # retrying: the same file again while it is live
            candidates = [self.target] + [p for p in candidates if p != self.target]
        for path in candidates[:8]:
            ids = read_data_file(self.table, files[path])["event_id"].to_pylist()
            live = [pos for pos, i in enumerate(ids) if i in self.alive]
            if live:
                self.target = path
                count = min(len(live), self.rng.randint(1, MAX_POSITIONS))
                chosen = sorted(self.rng.sample(live, count))
                return files[path], chosen, [ids[p] for p in chosen]
        return None

    def pos_delete(self) -> str | None:
        picked = self._pick_rows()
        if picked is None:
            return None
        data_file, positions, ids = picked
        self._check_live(f"event_id in ({', '.join(map(str, ids))})", ids)
        delete_file = write_position_delete_file(self.table, {data_file: positions})
        try:
            # Asserts the head it read: fails if anything (a compaction) committed meanwhile.
            commit_delete_files(self.table, [delete_file])
        except CONFLICTS:
            self.table.io.delete(delete_file.file_path)
            raise
        self.target = None
        self.alive.difference_update(ids)
        self._record({"op": "delete", "kind": "pos", "file": data_file.file_path, "ids": ids})
        return "pos-delete"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("catalog_db", type=Path)
    parser.add_argument("warehouse")
    parser.add_argument("table")
    parser.add_argument("ops", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("log", type=Path)
    args = parser.parse_args(argv)

    catalog = SqlCatalog("default", uri=f"sqlite:///{args.catalog_db}", warehouse=args.warehouse)
    table = catalog.load_table(args.table)
    rng = random.Random(args.seed)
    ops, weights = zip(*WEIGHTS.items(), strict=True)
    with args.log.open("a") as log:
        writer = Writer(table, rng, log)
        for number in range(args.ops):
            # Whatever compactions committed meanwhile, the table holds what this writer wrote.
            table.refresh()
            writer.check_table()
            writer.run_op("append" if number == 0 else rng.choices(ops, weights)[0])
            print("ready" if number == 0 else f"committed {number}", flush=True)
        table.refresh()
        writer.check_table()
    print(json.dumps(writer.counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
