"""Stress: compactions run again and again while another process appends and deletes rows.

The writer (``stress_writer.py``, a separate process with its own catalog connection) appends
batches, deletes ranges copy-on-write and deletes single rows merge-on-read with position
deletes, retrying whatever conflicts, and logs each operation once it has committed. Meanwhile
this process compacts the table in a loop, alternating all-or-nothing runs and partial progress.
At the end the table must hold exactly the rows the writer's log says it should, row for row.

Small in the normal suite (30 writer operations, about 10 s); larger with the flag, e.g.
``pytest tests/system/test_stress.py --stress-ops 300 -s`` (about 5 minutes on two cores: every
commit rewrites the table metadata, which grows with the snapshots, none of which are expired).
Set ``STRESS_SEED`` to vary the writer's choices.
"""

from __future__ import annotations

import queue
import subprocess
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compactor.bench.sample import create_events_table, events_batch
from compactor.commit.inflight import read_record
from compactor.compaction import RunResult, compact_table
from compactor.errors import CommitConflictError
from compactor.options import resolve_options

from support.rows import assert_same_rows, scan_rows
from support.stress import INITIAL_COMMITS, INITIAL_ROWS, TABLE, read_log, start_writer
from support.stress_writer import DAYS, FIRST_BATCH, ROWS_PER_BATCH
from support.tables import unreferenced_files

pytestmark = pytest.mark.slow  # left out by `make test-quick`

# A bound only: the writer always ends by itself; this stops a broken run from hanging.
WRITER_TIMEOUT_S = 900
RUN_ID = "compactor.run-id"


def _compact(catalog: Catalog, commit_every: int) -> RunResult:
    table = catalog.load_table(TABLE)
    options = resolve_options(
        TABLE,
        table.metadata.properties,
        target_file_size="256KiB",
        allow_small_target=True,
        min_input_files=2,
        parallelism=2,
        commit_every=commit_every,
    )
    return compact_table(table, options)


def _lines_of(writer: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The writer's stdout, line by line, as it comes; None at its end."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert writer.stdout is not None
        for line in writer.stdout:
            lines.put(line.strip())
        lines.put(None)

    threading.Thread(target=pump, name="writer-stdout", daemon=True).start()
    return lines


def _wait_for_commits(lines: queue.Queue[str | None], said: list[str]) -> bool:
    """Block until the writer says something (a commit, or its end), then take all it said.

    Returns True once the writer's output has ended. The timeout only bounds a broken run.
    """
    taken = [lines.get(timeout=WRITER_TIMEOUT_S)]
    while not lines.empty():
        taken.append(lines.get_nowait())
    said.extend(line for line in taken if line is not None)
    return None in taken


def _snapshots(table: Table) -> list:
    """The main branch's snapshots, oldest first (nothing else commits to other branches)."""
    return sorted(table.metadata.snapshots, key=lambda s: s.sequence_number)


def _is_compactor(snapshot) -> bool:
    return RUN_ID in (snapshot.summary.additional_properties if snapshot.summary else {})


def test_compactions_beside_a_writer_keep_exactly_the_rows_it_committed(
    catalog: Catalog, tmp_path: Path, stress_ops: int
) -> None:
    table = create_events_table(
        catalog,
        TABLE,
        commits=INITIAL_COMMITS,
        rows_per_commit=INITIAL_ROWS,
        properties={"format-version": "2"},
    )
    assert table.metadata.format_version == 2  # position deletes need v2
    assert INITIAL_COMMITS * INITIAL_ROWS <= FIRST_BATCH * ROWS_PER_BATCH  # ids never collide
    initial = scan_rows(table)
    initial_head = table.current_snapshot()
    assert initial_head is not None
    log = tmp_path / "writer.jsonl"
    stderr_path = tmp_path / "writer.stderr"

    results: list[RunResult] = []
    refused_runs: list[str] = []
    said: list[str] = []
    with stderr_path.open("w") as stderr:
        writer = start_writer(catalog, stress_ops, log, stderr)
        try:
            lines = _lines_of(writer)
            # "ready": the writer's first commit has landed, compactions from here on race with it.
            ended = _wait_for_commits(lines, said)
            # The writer prints a line per commit: one compaction each time it has committed
            # since the last one began, so that every run has something new to race with.
            for number in range(stress_ops + 1):
                if ended or said[0] != "ready":
                    break
                try:
                    results.append(_compact(catalog, commit_every=2 * (number % 2)))
                except CommitConflictError as exc:  # every group refused, or retries exhausted
                    refused_runs.append(str(exc))
                ended = _wait_for_commits(lines, said)
            writer.wait(timeout=WRITER_TIMEOUT_S)
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
    writer_stderr = stderr_path.read_text()
    assert said[:1] == ["ready"] and writer.returncode == 0, (
        f"writer exited with {writer.returncode}:\n{writer_stderr[-5000:]}"
    )
    during = [r for r in results if r.commits]

    # Once more with the writer gone: this one meets no concurrent commit.
    final = _compact(catalog, commit_every=0)
    assert not final.failures

    table = catalog.load_table(TABLE)
    batches, deleted = read_log(log, set(initial["event_id"].to_pylist()), stress_ops)
    expected = pa.concat_tables(
        [initial] + [events_batch(b, ROWS_PER_BATCH, DAYS).cast(initial.schema) for b in batches]
    )
    expected = expected.filter(pc.invert(pc.is_in(expected["event_id"], pa.array(deleted))))
    actual = scan_rows(table)

    # Every id the writer's record holds is in the table exactly once, and no other id.
    counts = Counter(actual["event_id"].to_pylist())
    expected_ids = set(expected["event_id"].to_pylist())
    duplicated = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(expected_ids - counts.keys())
    assert not duplicated, f"ids in the table more than once: {duplicated[:20]}"
    assert not missing, f"ids committed and never deleted, missing: {missing[:20]}"
    # Rows the writer deleted never come back (an equality-check corollary, stated outright).
    resurrected = sorted(deleted & counts.keys())
    assert not resurrected, f"deleted ids back in the table: {resurrected[:20]}"
    assert counts.keys() == expected_ids, (
        f"unknown ids: {sorted(counts.keys() - expected_ids)[:20]}"
    )
    # Row for row: every remaining row is exactly as it was written.
    assert_same_rows(expected, actual)

    # The test tested something: compactions committed between the writer's commits.
    snapshots = _snapshots(table)
    writer_seqs = [
        s.sequence_number
        for s in snapshots
        if s.sequence_number > initial_head.sequence_number and not _is_compactor(s)
    ]
    assert writer_seqs, "the writer committed nothing"
    interleaved = [
        s
        for s in snapshots
        if _is_compactor(s) and writer_seqs[0] < s.sequence_number < writer_seqs[-1]
    ]
    assert during and interleaved, (
        f"no compaction committed while the writer ran ({len(results)} runs, "
        f"{len(refused_runs)} refused)"
    )

    # compactor's own files were all either committed or cleaned up, and its run record is gone.
    leftovers = [p for p in unreferenced_files(table) if Path(p).name.startswith("compactor-")]
    assert leftovers == []
    assert read_record(table) is None

    # What happened, for -s / -rP: how hard the two sides raced.
    by_id = {s.snapshot_id: s for s in snapshots}
    raced = 0
    for result in results:
        start = by_id[result.plan.snapshot_id].sequence_number
        for commit in result.commits:
            end = by_id[commit.snapshot_id].sequence_number
            raced += any(start < seq < end for seq in writer_seqs)
    refused_groups = sum(1 for r in results for f in r.failures if f.kind == "conflict")
    print(
        f"writer: {said[-1]}; compactions: {len(results) + len(refused_runs)} "
        f"while writing, {len(during)} committed ({len(interleaved)} snapshots between writer "
        f"commits, {raced} over concurrent writer commits), {len(refused_runs)} refused whole, "
        f"{refused_groups} groups refused; final: {len(final.commits)} commits; "
        f"rows: {actual.num_rows}, deleted: {len(deleted)}"
    )
