"""The differential fuzzer (tests/support/fuzz.py) on fixed seeds, and the fuzzer's own parts.

Each seed is a random table history written by Iceberg Java, then compacted, maintained and read
back by Iceberg Java after every action (see tests/support/fuzz.py). The seeds were chosen for the
generator version in ``SEEDS_VERSION``, to cover every kind of operation and action between
them; docs/fuzzing.md records how they were chosen and what the fuzzer found. A seed that fails
prints its one-line reproduction (``make fuzz SEED=N``).

A seed listed in ``KNOWN_DEFECTS`` fails on a defect being fixed elsewhere: it is an expected
failure only while it fails that way (same action, same kind of difference); once the fix lands
it passes like the others.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from support.fuzz import Failure, Judge, run_history, run_seed
from support.fuzz_history import (
    GENERATOR_VERSION,
    Budget,
    Model,
    compile_history,
    ddmin,
    generate,
    new_model,
    shrink,
)
from support.java_reader import JavaReader

# The generator version the seeds below were chosen for: a new version draws other histories
# from the same seeds, so the set must be chosen again (docs/fuzzing.md says how).
SEEDS_VERSION = 1

SEEDS = (1, 3, 4, 6, 7, 8, 9, 10, 11, 13, 15, 23, 27, 33, 36, 51, 56, 59, 77, 84, 101, 123, 141)
# Identity partitions on double columns (values once rounded to single precision) and
# --output-spec-id into identity(uuid).
SEEDS += (5, 16, 500046)


@dataclass(frozen=True)
class KnownDefect:
    """A defect being fixed elsewhere, and how a seed that meets it fails."""

    reason: str
    signature: tuple[str, str]  # (action, kind) of tests/support/fuzz.py's Failure


# seed -> the defect it meets today (none: every defect the seeds found is fixed).
KNOWN_DEFECTS: dict[int, KnownDefect] = {}


def test_the_seeds_were_chosen_for_this_generator() -> None:
    assert GENERATOR_VERSION == SEEDS_VERSION, (
        f"the generator is at version {GENERATOR_VERSION}, the seeds were chosen for "
        f"{SEEDS_VERSION}: choose them again (docs/fuzzing.md)"
    )
    assert set(KNOWN_DEFECTS) <= set(SEEDS)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_java_reads_the_same_rows_after_every_action(
    seed: int, tmp_path: Path, java_reader: JavaReader
) -> None:
    outcome = run_seed(seed, tmp_path)

    assert outcome.invalid is None, outcome.report()
    known = KNOWN_DEFECTS.get(seed)
    failure = outcome.failure
    if known is not None and failure is not None and failure.signature == known.signature:
        pytest.xfail(f"{known.reason}: {failure.summary()}")
    assert outcome.failure is None, outcome.report()
    # Every action ran and was judged: none raised, each either did its work or refused.
    assert len(outcome.actions) == len(compile_history(outcome.history)[1]) > 0
    assert all(a.endswith(" ok") or " refused: " in a for a in outcome.actions)


# --------------------------------------------------------------------------------------------
# The generator and the replay
# --------------------------------------------------------------------------------------------


def test_a_seed_always_gives_the_same_history() -> None:
    for seed in range(20):
        history = generate(seed)
        assert json.loads(json.dumps(history)) == history == generate(seed)
    assert generate(1) != generate(2)


def _kinds(seeds: range) -> Counter[str]:
    seen: Counter[str] = Counter()
    for seed in seeds:
        history = generate(seed)
        java, actions = compile_history(history)
        # Every operation the generator made is valid when replayed.
        assert len(java["ops"]) == len(history["ops"]), seed
        seen[f"format v{history['format_version']}"] += 1
        for op in java["ops"]:
            seen[op["op"]] += 1
            if "scope" in op:
                seen[f"{op['op']} {op['scope']}"] += 1
            if op.get("branch"):
                seen["append to a branch"] += 1
            for f in op.get("files", ()):
                seen["empty file" if not f["rows"] else "file"] += 1
            for field in op.get("fields", ()):
                seen[field["transform"].split("[")[0]] += 1
        for field in java["spec"]:
            seen[field["transform"].split("[")[0]] += 1
        for action in actions:
            seen[action["action"]] += 1
            seen[f"strategy {action.get('strategy')}"] += 1
            seen["output spec"] += "output_spec" in action
            seen["branch run"] += "branch" in action
        text = json.dumps(history)
        for name, bits in (
            ("NaN", '"7ff8000000000001"'),
            ("-0.0", '"8000000000000000"'),
            ("float NaN", '"ffc00000"'),
            ("zero byte", '"a\\u0000b"'),
            ("DST", "1711846800000000"),
        ):
            seen[name] += bits in text
    return seen


def test_the_generator_makes_every_operation_transform_and_hurtful_value() -> None:
    seen = _kinds(range(200))

    expected = {
        "format v2",
        "format v3",
        "append",
        "append to a branch",
        "empty file",
        "delete_positions file",
        "delete_positions partition",
        "delete_equality partition",
        "delete_equality global",
        "add_column",
        "drop_column",
        "rename_column",
        "promote",
        "set_spec",
        "branch",
        "tag",
        "upgrade",
        "identity",
        "bucket",
        "truncate",
        "year",
        "month",
        "day",
        "hour",
        "void",
        "run",
        "strategy binpack",
        "strategy sort",
        "strategy zorder",
        "output spec",
        "branch run",
        "rewrite_deletes",
        "expire",
        "orphans",
        "NaN",
        "-0.0",
        "float NaN",
        "zero byte",
        "DST",
    }
    assert not expected - {kind for kind, n in seen.items() if n}, expected - set(seen)


def _history(**changes: Any) -> dict[str, Any]:
    history: dict[str, Any] = {
        "version": GENERATOR_VERSION,
        "seed": 0,
        "format_version": 2,
        "properties": {},
        "schema": [{"column": "c0", "type": "long"}, {"column": "c1", "type": "float"}],
        "spec": [],
        "ops": [
            {"op": "append", "files": [{"label": "f1", "rows": [{"c0": 1, "c1": "7fc00000"}]}]},
            {"op": "add_column", "column": "c2", "type": "string"},
            {"op": "promote", "column": "c1", "type": "double"},
            {
                "op": "append",
                "files": [{"label": "f2", "rows": [{"c0": 2, "c1": "8000000000000000"}]}],
            },
            {"op": "delete_positions", "targets": [{"file": "f1", "rows": [0]}], "scope": "file"},
            {
                "op": "delete_equality",
                "columns": ["c2"],
                "keys": [["x"]],
                "scope": "partition",
                "partition_row": {"c0": 2},
            },
        ],
        "actions": [{"action": "run", "strategy": "sort", "columns": [["c2", "ASC", "FIRST"]]}],
    }
    history.update(changes)
    return history


def test_replaying_drops_what_refers_to_removed_operations_and_fits_values_to_types() -> None:
    full, _ = compile_history(_history())
    assert [op["op"] for op in full["ops"]] == [
        "append",
        "add_column",
        "promote",
        "append",
        "delete_positions",
        "delete_equality",
    ]
    history = _history()
    del history["ops"][0]  # the file the position delete names
    del history["ops"][0]  # the column the equality delete and the sort name
    java, actions = compile_history(history)
    assert [op["op"] for op in java["ops"]] == ["promote", "append"]
    assert actions == []
    # Without the promotion, the double -0.0 is written to the float column as float -0.0.
    history = _history()
    del history["ops"][2]
    java, _ = compile_history(history)
    assert java["ops"][2]["files"][0]["rows"] == [{"c0": 2, "c1": "80000000"}]


def test_a_column_a_spec_or_a_delete_uses_is_never_dropped() -> None:
    model, _ = new_model(_history(spec=[{"column": "c0", "transform": "bucket[2]", "name": "p"}]))
    assert model.apply({"op": "drop_column", "column": "c0"}) is None
    assert model.apply({"op": "drop_column", "column": "c1"}) == {
        "op": "drop_column",
        "name": "c1",
    }
    empty = Model(format_version=2)
    assert empty.apply({"op": "tag", "name": "t"}) is None  # no snapshot to tag yet


def test_delta_debugging_finds_the_two_items_that_fail_together() -> None:
    tries: list[list[int]] = []

    def fails(items: list[int]) -> bool:
        tries.append(items)
        return 3 in items and 11 in items

    assert ddmin(list(range(16)), fails, Budget(200)) == [3, 11]
    assert ddmin(list(range(16)), fails, Budget(3)) != [3, 11]  # the budget bounds the work
    assert len(tries) <= 203


def test_shrinking_keeps_a_failing_history_failing_and_makes_it_small() -> None:
    history = generate(4)
    assert sum(op["op"] == "delete_equality" for op in history["ops"]) >= 1

    def fails(candidate: dict[str, Any]) -> bool:
        java, _ = compile_history(candidate)
        return any(op["op"] == "delete_equality" for op in java["ops"])

    small = shrink(history, fails, Budget(300))

    assert fails(small)
    assert len(small["ops"]) == 1 and small["ops"][0]["op"] == "delete_equality"
    assert small["actions"] == [] and len(small["ops"][0]["keys"]) == 1
    # Only the columns the history still has keep values.
    columns = {c["column"] for c in small["schema"]}
    assert set(small["ops"][0].get("partition_row", {})) <= columns


# --------------------------------------------------------------------------------------------
# The judge: it must see what a broken action does
# --------------------------------------------------------------------------------------------


SMALL = _history(
    ops=[
        {
            "op": "append",
            "files": [
                {"label": "f1", "rows": [{"c0": i, "c1": "3fc00000"} for i in range(6)]},
                {"label": "f2", "rows": [{"c0": i, "c1": "7fc00000"} for i in range(4)]},
            ],
        },
        {"op": "delete_positions", "targets": [{"file": "f1", "rows": [1, 2]}], "scope": "file"},
        {"op": "tag", "name": "t1"},
    ],
    actions=[{"action": "run", "strategy": "binpack"}, {"action": "expire"}],
)


def test_a_small_history_passes_and_every_action_is_judged(
    tmp_path: Path, java_reader: JavaReader
) -> None:
    outcome = run_history(SMALL, tmp_path)

    assert outcome.ok, outcome.report()
    assert outcome.actions == ["run:binpack ok", "expire ok"]
    assert outcome.stats["rewritten_files"] == 2 and outcome.stats["deleted_rows_applied"] == 2


def test_a_refusal_is_counted_and_not_a_failure(tmp_path: Path, java_reader: JavaReader) -> None:
    # rewrite-deletes refuses format v3 tables (their position deletes are deletion vectors).
    history = {**SMALL, "format_version": 3, "actions": [{"action": "rewrite_deletes"}]}

    outcome = run_history(history, tmp_path)

    assert outcome.ok and outcome.refused == 1, outcome.report()
    assert outcome.actions[0].startswith("rewrite-deletes refused: ")


@pytest.mark.parametrize("sabotage", ["resurrect", "lose-file", "raise"])
def test_a_broken_action_is_reported_with_its_kind(
    sabotage: str, tmp_path: Path, java_reader: JavaReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-ins for a compactor that brings a row back, deletes a live file, or crashes."""
    from support import fuzz

    def broken(action: dict[str, Any], table: Any) -> dict[str, Any]:
        if sabotage == "resurrect":
            row = {"c0": pa.array([1], pa.int64()), "c1": pa.array([1.5], pa.float32())}
            table.append(pa.table(row))
        elif sabotage == "lose-file":
            data = table.inspect.data_files().column("file_path").to_pylist()
            Path(data[0].removeprefix("file://")).unlink()
        else:
            raise KeyError("c9")
        return {}

    monkeypatch.setattr(fuzz, "_perform", broken)
    outcome = run_history({**SMALL, "actions": [{"action": "run"}]}, tmp_path)

    assert outcome.failure is not None and outcome.failure.action == "run:binpack"
    expected = {"resurrect": "rows", "lose-file": "unreadable", "raise": "exception"}
    assert outcome.failure.kind == expected[sabotage], outcome.report()
    assert outcome.report().startswith("history: FAIL after run:binpack: ")


def test_the_judge_compares_refs_snapshots_and_new_snapshots() -> None:
    rows = Counter({'["a"]': 1})

    class Read:
        def __init__(self, current: Counter[str], ref: Counter[str], snapshot: Counter[str]):
            self.current = _Rows(current)
            self.refs = {"t1": _Ref(_Rows(ref))}
            self.snapshots = {7: _Ref(_Rows(snapshot))}

    judge = Judge(Read(rows, rows, rows))  # type: ignore[arg-type]
    assert judge.check(Read(rows, rows, rows)) is None  # type: ignore[arg-type]
    other = Counter({'["b"]': 1})
    new_snapshot = Read(rows, rows, rows)
    new_snapshot.snapshots[9] = _Ref(_Rows(other))
    for read, where in (
        (Read(other, rows, rows), "current state"),
        (Read(rows, other, rows), "ref t1"),
        (Read(rows, rows, other), "snapshot 7"),
        (new_snapshot, "new snapshot 9"),
    ):
        found = judge.check(read)  # type: ignore[arg-type]
        assert found is not None and found[0] == "rows" and where in found[1]
    assert Failure("run:sort", "rows", "x\ny").summary() == "run:sort: rows: x"


@dataclass
class _Rows:
    rows: Counter[str]
    lineage: Any = None


@dataclass
class _Ref:
    read: _Rows
