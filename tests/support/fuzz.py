"""A differential fuzzer: random table histories written by Iceberg Java, compacted, judged by Java.

Each seed gives a history (fuzz_history.py: schema and partition evolution, appends, position
and equality deletes, deletion vectors, branches and tags, over values chosen to hurt) and a list
of compactor actions. ``compactor.fuzzwriter.HistoryWriter`` (tests/support/java) writes the
table with Iceberg Java's own writers; it is registered in a fresh SQLite catalog. Iceberg Java
(the suite's reader, java_reader.py) then reads the rows of the current state, of every snapshot
and of every branch and tag. After each action (``run`` with each strategy, ``--output-spec-id``
and ``--branch``, ``rewrite-deletes``, ``expire``, ``orphans``, through the library API):

- Java reads exactly the same rows for the current state and every ref, and for every snapshot
  still in the metadata; every new snapshot reads the rows of the current state or of a branch;
- on format v3, every row keeps its ``_row_id`` and ``_last_updated_sequence_number`` (a row
  that had none may get one);
- every file any snapshot references (manifest lists, manifests, live data and delete files)
  exists, as Java lists them;
- nothing outside the table's location is touched.

An action that refuses the table with a one-line :class:`~compactor.errors.UsageError` or
:class:`~compactor.errors.UnsupportedTableError` is counted as refused; any other exception, a
group that failed or a file skipped is a failure. A failing seed prints a one-line reproduction
and is shrunk (delta debugging over actions, operations, columns, files, rows and keys, within a
budget of tries) to a small history that fails the same way, printed as JSON.

Run ``make fuzz SEEDS=N`` (N random seeds), ``make fuzz SEED=1234`` (one), or
``.venv/bin/python tests/support/fuzz.py --help``. docs/fuzzing.md records the runs and what they
found.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import json
import logging
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for ``support``

from support.fuzz_history import (  # noqa: E402
    GENERATOR_VERSION,
    Budget,
    compile_history,
    generate,
    shrink,
)
from support.java_reader import (  # noqa: E402
    JVM_OPTIONS,
    JavaRead,
    JavaReadError,
    ensure_reader,
    java_read,
)

WRITER_CLASS = "compactor.fuzzwriter.HistoryWriter"
WRITE_TIMEOUT_S = 300
NAMESPACE, TABLE = "db", "history"
IDENTIFIER = f"{NAMESPACE}.{TABLE}"
SHRINK_TRIES = 100


class HistoryWriteError(RuntimeError):
    """Iceberg Java could not write a history: a fault of the generator, not of compactor."""


# --------------------------------------------------------------------------------------------
# The Java writer, one JVM per process
# --------------------------------------------------------------------------------------------


class _WriterServer:
    """A running ``HistoryWriter --serve``: one JSON request a line, one answer a line."""

    def __init__(self) -> None:
        reader = ensure_reader()  # the same Maven project: built and cached together
        fd, log = tempfile.mkstemp(prefix="compactor-history-writer-", suffix=".log")
        os.unlink(log)
        self._log_fd = fd
        self.classpath = reader.classpath
        self.owner = os.getpid()
        command = [reader.java, *JVM_OPTIONS, "-cp", reader.classpath, WRITER_CLASS, "--serve"]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd
        )
        self._buffer = bytearray()

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
            self.process.stdin.flush()
        except OSError as e:
            raise HistoryWriteError(f"the history writer is gone: {self._tail()}") from e
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        while (newline := self._buffer.find(b"\n")) < 0:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop(kill=True)
                raise HistoryWriteError(f"the history writer timed out after {WRITE_TIMEOUT_S}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise HistoryWriteError(f"the history writer died: {self._tail()}")
                self._buffer += chunk
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        answer = json.loads(line)
        if not answer["ok"]:
            raise HistoryWriteError(answer["error"])
        return answer["result"]

    def _tail(self) -> str:
        size = os.fstat(self._log_fd).st_size
        return os.pread(self._log_fd, 4000, max(0, size - 4000)).decode(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, kill: bool = False) -> None:
        if self.owner != os.getpid():
            return
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        if kill:
            self.process.kill()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            os.close(self._log_fd)


_writer_lock = threading.Lock()
_writer: _WriterServer | None = None


def _writer_request(message: dict[str, Any]) -> dict[str, Any]:
    global _writer
    with _writer_lock:
        reader = ensure_reader()
        if _writer is not None and (not _writer.alive() or _writer.classpath != reader.classpath):
            _writer.stop(kill=True)
            _writer = None
        if _writer is None:
            _writer = _WriterServer()
        return _writer.request(message)


def stop_writer() -> None:
    """Stop this process's history writer, if one runs."""
    global _writer
    with _writer_lock:
        if _writer is not None:
            _writer.stop()
            _writer = None


atexit.register(stop_writer)


def write_table(java_history: dict[str, Any], location: Path) -> dict[str, Any]:
    """Write a compiled history at ``location`` with Iceberg Java; returns what it wrote."""
    return _writer_request(
        {"cmd": "write", "location": location.resolve().as_uri(), "history": java_history}
    )


def referenced_files(metadata_location: str) -> dict[str, Any]:
    """Every file the table's snapshots reference, as Java lists them, and the missing ones."""
    return _writer_request({"cmd": "files", "metadata_location": metadata_location})


# --------------------------------------------------------------------------------------------
# Running a history
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """What went wrong after ``action`` (``run:sort``, ``expire``, ...). ``kind``: exception
    (raised), groups (failed groups, skipped files, failed deletes), load (pyiceberg cannot load
    the table), unreadable (Java cannot read it), rows, lineage, missing (a referenced file),
    outside (a file beside the table changed). ``signature`` is what shrinking keeps."""

    action: str
    kind: str
    detail: str

    @property
    def signature(self) -> tuple[str, str]:
        return (self.action, self.kind)

    def summary(self) -> str:
        first = self.detail.strip().splitlines()[0] if self.detail.strip() else ""
        return f"{self.action}: {self.kind}: {first[:400]}"


@dataclass
class Outcome:
    """One history's run: its actions' results and the first failure, if any."""

    seed: int | None
    history: dict[str, Any]
    actions: list[str] = field(default_factory=list)  # "run:sort ok", "expire refused: ..."
    failure: Failure | None = None
    invalid: str | None = None  # the history itself could not be written or read by Java
    stats: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is None and self.invalid is None

    @property
    def refused(self) -> int:
        return sum(1 for a in self.actions if " refused" in a)

    def reproduction(self) -> str:
        if self.seed is None:
            return (
                ".venv/bin/python tests/support/fuzz.py --history FILE (the history printed below)"
            )
        return (
            f"make fuzz SEED={self.seed}  "
            f"(or: .venv/bin/python tests/support/fuzz.py --seed {self.seed})"
        )

    def report(self) -> str:
        head = f"seed {self.seed}" if self.seed is not None else "history"
        if self.invalid is not None:
            return f"{head}: INVALID HISTORY (a generator fault): {self.invalid}"
        if self.failure is None:
            return (
                f"{head}: ok, {len(self.actions)} actions ({self.refused} refused) "
                f"in {self.seconds:.1f}s"
            )
        return (
            f"{head}: FAIL after {self.failure.summary()}\n"
            f"  reproduce: {self.reproduction()}\n"
            f"  actions: {'; '.join(self.actions)}"
        )


def _action_name(action: dict[str, Any]) -> str:
    if action["action"] != "run":
        return action["action"].replace("_", "-")
    if action.get("output_spec"):
        return "run:output-spec"
    if action.get("branch"):
        return "run:branch"
    return f"run:{action.get('strategy', 'binpack')}"


def _refusal(error: BaseException) -> bool:
    from compactor.errors import UnsupportedTableError, UsageError

    text = str(error).strip()
    return isinstance(error, UsageError | UnsupportedTableError) and "\n" not in text and bool(text)


def _perform(action: dict[str, Any], table: Any) -> dict[str, Any]:
    """Run one compactor action through the library API; its JSON result."""
    import compactor

    kind = action["action"]
    if kind == "run":
        options: dict[str, Any] = {
            "target_file_size": "1MiB",
            "allow_small_target": True,
            "min_input_files": 2,
            "rewrite_all": action.get("rewrite_all", True),
            "bulk_read": action.get("bulk_read", True),
            "parallelism": action.get("parallelism", 1),
            "strategy": action.get("strategy", "binpack"),
        }
        if action.get("strategy") == "sort":
            options["sort_order"] = ", ".join(
                f"{name} {direction} NULLS {nulls}" for name, direction, nulls in action["columns"]
            )
        if action.get("strategy") == "zorder":
            options["zorder"] = ", ".join(action["columns"])
        if action.get("branch"):
            options["branch"] = action["branch"]
        if action.get("output_spec"):
            specs = table.metadata.partition_specs
            options["output_spec_id"] = (
                table.metadata.default_spec_id
                if action["output_spec"] == "current"
                else min(s.spec_id for s in specs)
            )
        return compactor.compact(table, **options).to_dict()
    if kind == "rewrite_deletes":
        return compactor.rewrite_deletes(table).to_dict()
    if kind == "expire":
        now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
        return compactor.expire_snapshots(
            table, older_than=now.isoformat(), retain_last=1
        ).to_dict()
    if kind == "orphans":
        return compactor.remove_orphans(
            table, older_than="0s", allow_short_older_than=True
        ).to_dict()
    raise ValueError(f"unknown action {kind}")


def _result_problems(result: dict[str, Any]) -> str | None:
    """What a result reports as not done: failed groups, skipped files, failed deletes."""
    problems = []
    for key in ("failed_groups", "skipped_files", "conflicts"):
        if result.get(key):
            problems.append(f"{key}: {result[key]}")
    if result.get("failed"):
        problems.append(f"failed deletes: {result['failed']}")
    return "; ".join(problems) or None


class Judge:
    """Compares what Iceberg Java reads of a table with what it read before the first action."""

    def __init__(self, read: JavaRead) -> None:
        self.current = read.current.rows
        self.lineage = read.current.lineage
        self.refs = {name: ref.read.rows for name, ref in read.refs.items() if ref.read}
        self.snapshots = {sid: s.read.rows for sid, s in read.snapshots.items() if s.read}

    def check(self, read: JavaRead) -> tuple[str, str] | None:
        """(kind, detail) of the first difference, or None."""
        if read.current.rows != self.current:
            return "rows", "current state: " + _diff(self.current, read.current.rows)
        if self.lineage is not None and read.current.lineage is not None:
            kept = Counter({k: n for k, n in self.lineage.items() if k[1] is not None})
            lost = kept - read.current.lineage
            ids = [k[1] for k in read.current.lineage.elements() if k[1] is not None]
            if lost:
                return "lineage", f"rows lost their lineage: {list(lost.items())[:3]}"
            if len(set(ids)) != len(ids):
                return "lineage", "two rows share a _row_id"
        for name, rows in self.refs.items():
            ref = read.refs.get(name)
            if ref is None:
                return "rows", f"ref {name} is gone"
            if ref.read is not None and ref.read.rows != rows:
                return "rows", f"ref {name}: " + _diff(rows, ref.read.rows)
        candidates = [self.current, *self.refs.values()]
        for sid, snapshot in read.snapshots.items():
            if snapshot.read is None:
                continue
            if sid in self.snapshots:
                if snapshot.read.rows != self.snapshots[sid]:
                    return "rows", f"snapshot {sid}: " + _diff(
                        self.snapshots[sid], snapshot.read.rows
                    )
            elif snapshot.read.rows not in candidates:
                return "rows", f"new snapshot {sid} reads rows of no ref: " + _diff(
                    self.current, snapshot.read.rows
                )
        return None


def _diff(expected: Counter[str], actual: Counter[str], limit: int = 3) -> str:
    missing = list((expected - actual).items())[:limit]
    extra = list((actual - expected).items())[:limit]
    return (
        f"expected {expected.total()} rows, read {actual.total()}; "
        f"missing (row, count) {missing}; extra {extra}"
    )


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """compactor's logs and numpy's runtime warnings off: they would drown the report."""
    logger = logging.getLogger("compactor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield
    finally:
        logger.setLevel(level)


def run_history(
    history: dict[str, Any],
    workdir: Path,
    seed: int | None = None,
    stop_after: tuple[str, str] | None = None,
) -> Outcome:
    """Write ``history`` in ``workdir`` (an empty directory), run its actions, judge each.

    ``stop_after``: a failure signature; while shrinking, stop as soon as the outcome is known.
    """
    from pyiceberg.catalog.sql import SqlCatalog

    started = time.monotonic()
    outcome = Outcome(seed=seed, history=history)
    try:
        java_history, actions = compile_history(history)
    except ValueError as e:
        outcome.invalid = f"cannot compile: {e}"
        return outcome
    warehouse = workdir / "wh"
    location = warehouse / TABLE
    # Another table's files beside this one: no action may touch them.
    neighbour = warehouse / "neighbour" / "data"
    neighbour.mkdir(parents=True)
    (neighbour / "00000-0-keep.parquet").write_bytes(b"not this table's")
    try:
        written = write_table(java_history, location)
    except HistoryWriteError as e:
        outcome.invalid = f"Iceberg Java could not write it: {str(e).strip().splitlines()[0]}"
        return outcome
    outcome.stats.update({f"written_{k}": v for k, v in written["written"].items()})
    outcome.stats["format_v3"] += written["format_version"] == 3
    outcome.stats["several_specs"] += written["specs"] > 1
    catalog = SqlCatalog(
        "fuzz", uri=f"sqlite:///{workdir}/catalog.db", warehouse=warehouse.as_uri()
    )
    catalog.create_namespace(NAMESPACE)
    try:
        table = catalog.register_table((NAMESPACE, TABLE), written["metadata_location"])
        before = java_read(table)
    except JavaReadError as e:
        outcome.invalid = f"Iceberg Java cannot read what it wrote: {e}"
        return outcome
    except Exception as e:  # pyiceberg cannot load what Java wrote
        outcome.failure = Failure("load", "exception", f"{type(e).__name__}: {e}")
        return outcome
    missing = referenced_files(table.metadata_location)["missing"]
    if missing:
        outcome.invalid = f"Iceberg Java wrote a table whose files are missing: {missing[:3]}"
        return outcome
    judge = Judge(before)
    neighbour_files = _tree(warehouse / "neighbour")
    with _quiet():
        for action in actions:
            name = _action_name(action)
            failure = _run_action(action, name, catalog, judge, outcome)
            if failure is None and _tree(warehouse / "neighbour") != neighbour_files:
                failure = Failure(name, "outside", "a file outside the table's location changed")
            if failure is not None:
                outcome.failure = failure
                break
            if stop_after is not None and name == stop_after[0]:
                break
    outcome.seconds = time.monotonic() - started
    return outcome


def _run_action(
    action: dict[str, Any], name: str, catalog: Any, judge: Judge, outcome: Outcome
) -> Failure | None:
    try:
        result = _perform(action, catalog.load_table(IDENTIFIER))
    except Exception as e:
        if _refusal(e):
            outcome.actions.append(f"{name} refused: {str(e).strip()}")
            return None
        detail = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        outcome.actions.append(f"{name} raised {type(e).__name__}")
        return Failure(name, "exception", detail)
    problems = _result_problems(result)
    if problems:
        outcome.actions.append(f"{name} reported problems")
        return Failure(name, "groups", problems)
    outcome.actions.append(f"{name} ok")
    outcome.stats[f"{name} ok"] += 1
    outcome.stats["rewritten_files"] += result.get("rewritten_files", 0)
    outcome.stats["deleted_rows_applied"] += result.get("deleted_rows_applied", 0)
    outcome.stats["removed_delete_files"] += result.get("rewritten_delete_files", 0)
    outcome.stats["files_deleted"] += result.get("files_deleted", 0)
    try:
        table = catalog.load_table(IDENTIFIER)
    except Exception as e:  # pyiceberg cannot load what compactor committed
        return Failure(name, "load", f"{type(e).__name__}: {e}")
    try:
        read = java_read(table)
        files = referenced_files(table.metadata_location)
    except (JavaReadError, HistoryWriteError) as e:
        return Failure(name, "unreadable", str(e))
    difference = judge.check(read)
    if difference is not None:
        return Failure(name, *difference)
    if files["missing"]:
        return Failure(name, "missing", json.dumps(files["missing"][:5]))
    return None


def run_seed(seed: int, workdir: Path) -> Outcome:
    """Generate and run the history of ``seed`` in ``workdir``."""
    return run_history(generate(seed), workdir, seed=seed)


# --------------------------------------------------------------------------------------------
# Shrinking a failure
# --------------------------------------------------------------------------------------------


def shrink_failure(
    outcome: Outcome, scratch: Path, tries: int = SHRINK_TRIES, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """A smaller history that fails with the same signature as ``outcome`` (within ``tries``)."""
    assert outcome.failure is not None
    signature = outcome.failure.signature
    counter = iter(range(1 << 30))

    def fails(candidate: dict[str, Any]) -> bool:
        workdir = scratch / f"try-{next(counter)}"
        workdir.mkdir(parents=True)
        try:
            again = run_history(candidate, workdir, stop_after=signature)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return again.failure is not None and again.failure.signature == signature

    budget = Budget(tries)
    small = shrink(outcome.history, fails, budget)
    log(f"  shrunk in {tries - budget.left} tries")
    return small


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tests/support/fuzz.py",
        description="Random Iceberg table histories written by Iceberg Java, compacted by "
        "compactor, and read back by Iceberg Java: rows and files must survive every action.",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--seed", type=int, action="append", help="run this seed (repeatable)")
    what.add_argument("--seeds", type=int, default=10, help="run this many seeds (default 10)")
    what.add_argument("--history", type=Path, help="run the history in this JSON file")
    parser.add_argument("--start", type=int, help="with --seeds: the first seed (default random)")
    parser.add_argument("--no-shrink", action="store_true", help="do not shrink failures")
    parser.add_argument("--shrink-tries", type=int, default=SHRINK_TRIES)
    parser.add_argument("--show", action="store_true", help="print each history as JSON")
    parser.add_argument("--keep", type=Path, help="keep each table in a directory under this")
    parser.add_argument("--report", type=Path, help="write a JSON line per history here")
    args = parser.parse_args(argv)

    if args.history is not None:
        histories = [(None, json.loads(args.history.read_text()))]
    else:
        if args.seed:
            seeds = args.seed
        else:
            start = args.start if args.start is not None else random.SystemRandom().randrange(10**6)
            seeds = list(range(start, start + args.seeds))
        histories = [(seed, None) for seed in seeds]

    started = time.monotonic()
    totals: Counter[str] = Counter()
    failures: list[Outcome] = []
    print(f"generator v{GENERATOR_VERSION}, {len(histories)} histories", flush=True)
    with tempfile.TemporaryDirectory(prefix="compactor-fuzz-") as tmp:
        root = args.keep or Path(tmp)
        for index, (seed, history) in enumerate(histories):
            history = history if history is not None else generate(seed)
            workdir = root / (f"seed-{seed}" if seed is not None else f"history-{index}")
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.mkdir(parents=True)
            if args.show:
                print(json.dumps(history))
            outcome = run_history(history, workdir, seed=seed)
            print(outcome.report(), flush=True)
            totals["histories"] += 1
            totals["ok" if outcome.ok else "invalid" if outcome.invalid else "failed"] += 1
            totals["actions"] += len(outcome.actions)
            totals["refused"] += outcome.refused
            totals.update(outcome.stats)
            if args.report is not None:
                with args.report.open("a") as out:
                    out.write(json.dumps(_report_line(outcome)) + "\n")
            if outcome.failure is not None:
                failures.append(outcome)
                if not args.no_shrink:
                    small = shrink_failure(
                        outcome, root / "shrink" / f"{index}", tries=args.shrink_tries
                    )
                    print(f"  smallest failing history: {json.dumps(small)}", flush=True)
            if args.keep is None:
                shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(
        f"{totals['histories']} histories in {elapsed:.0f}s: {totals['ok']} ok, "
        f"{totals['failed']} failed, {totals['invalid']} invalid; {totals['actions']} actions, "
        f"{totals['refused']} refused"
    )
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    for outcome in failures:
        assert outcome.failure is not None
        print(f"  seed {outcome.seed}: {outcome.failure.summary()}")
    return 0 if totals["failed"] == 0 and totals["invalid"] == 0 else 1


def _report_line(outcome: Outcome) -> dict[str, Any]:
    return {
        "seed": outcome.seed,
        "version": GENERATOR_VERSION,
        "ok": outcome.ok,
        "invalid": outcome.invalid,
        "failure": None if outcome.failure is None else outcome.failure.summary(),
        "signature": None if outcome.failure is None else list(outcome.failure.signature),
        "actions": outcome.actions,
        "seconds": round(outcome.seconds, 2),
    }


if __name__ == "__main__":
    sys.exit(main())
