"""Options: defaults that follow the machine (CPUs and memory allowed), what a job file's
section and a table property resolve to, and errors that name the option at fault."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compactor.daemon.jobfiles import CompactAction
from compactor.errors import UsageError
from compactor.options import compact, defaults, environment, resolve_options
from compactor.options.environment import default_parallelism


@pytest.mark.parametrize(
    ("cpu_max", "limit"),
    [("max 100000\n", None), ("100000 100000\n", 1), ("150000 100000\n", 2), ("50000 100000", 1)],
)
def test_parallelism_follows_affinity_and_the_cgroup_cpu_limit(
    cpu_max: str, limit: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text(cpu_max)
    monkeypatch.setattr(environment, "CGROUP_CPU_MAX", tmp_path / "cpu.max")
    expected = allowed if limit is None else min(allowed, limit)
    assert environment.default_parallelism() == expected


def test_parallelism_without_cgroup_files_is_the_affinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "CGROUP_CPU_MAX", tmp_path / "absent")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert environment.default_parallelism() == 1


def test_the_memory_limit_sizes_each_workers_buffers_and_caps_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compact, "default_parallelism", lambda: 8)
    mib = defaults.MiB

    tight = resolve_options("db.t", {}, memory_limit="448MiB")
    roomy = resolve_options("db.t", {}, memory_limit="4GiB")
    pinned = resolve_options("db.t", {}, memory_limit="448MiB", parallelism=1)
    crowded = resolve_options("db.t", {}, memory_limit="448MiB", parallelism=8)
    on_ray = resolve_options("db.t", {}, memory_limit="448MiB", parallelism=4, executor="ray")

    # 288 MiB past the process allowance: two workers of 96 MiB overhead + three 16 MiB shares.
    assert (
        tight.execution.parallelism,
        tight.execution.read_ahead,
        tight.execution.row_group_size,
    ) == (2, 16 * mib, 16 * mib)
    assert roomy.execution.parallelism == 8
    # A row group's rows get one share in memory, even past the table's row-group size: that
    # counts written bytes, which take several times fewer (the writer closes row groups by it).
    assert (
        roomy.execution.row_group_size
        == roomy.execution.read_ahead
        > defaults.DEFAULT_ROW_GROUP_SIZE
    )
    assert (pinned.execution.parallelism, pinned.execution.read_ahead) == (
        1,
        64 * mib,
    )  # (288 - 96) / 3
    assert (crowded.execution.parallelism, crowded.execution.read_ahead) == (8, defaults.MIN_SHARE)
    # Each Ray task runs in a process of its own: the limit is that process's.
    assert (on_ray.execution.parallelism, on_ray.execution.read_ahead) == (4, 64 * mib)
    assert resolve_options("db.t", {}).execution.memory_limit == defaults.DEFAULT_MEMORY_LIMIT


def test_the_rewrite_gets_the_memory_the_plan_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The files a plan keeps stay in the process until its commit: a run's threads get their
    shares of what is left, never less than the minimum; Ray tasks run in their own processes."""
    monkeypatch.setattr(compact, "default_parallelism", lambda: 1)
    mib = defaults.MiB
    alone = resolve_options("db.t", {}, memory_limit="448MiB").execution
    on_ray = resolve_options("db.t", {}, memory_limit="448MiB", executor="ray").execution
    files_of = {held: held * mib // defaults.PLANNED_FILE_BYTES for held in (12, 120, 300)}

    assert (alone.read_ahead, alone.row_group_size) == (64 * mib, 64 * mib)  # (288 - 96) / 3
    assert alone.beside_plan(0) == alone
    beside = alone.beside_plan(files_of[120])
    assert beside.read_ahead == beside.row_group_size
    assert beside.read_ahead // mib == 24  # (288 - 120 - 96) / 3
    assert beside.parallelism == alone.parallelism
    assert alone.beside_plan(files_of[300]).read_ahead == defaults.MIN_SHARE
    assert alone.beside_plan(files_of[12]).read_ahead // mib == 60
    assert on_ray.beside_plan(files_of[300]) == on_ray


def test_a_memory_limit_below_the_minimum_is_a_usage_error_naming_it() -> None:
    with pytest.raises(
        UsageError, match=r"^memory_limit: 100.0 MiB is below the minimum 304.0 MiB"
    ):
        resolve_options("db.t", {}, memory_limit="100MiB")


@pytest.mark.parametrize(
    ("value", "used", "allowed_small"),
    [
        ("1024", defaults.MIN_TARGET_FILE_SIZE, False),
        (str(2**40), defaults.MAX_TARGET_FILE_SIZE, False),
        ("0", defaults.MIN_TARGET_FILE_SIZE, False),
        ("1024", 1024, True),
    ],
    ids=["tiny", "huge", "zero", "tiny-allowed"],
)
def test_a_table_target_outside_the_range_uses_the_nearest_bound_with_a_warning(
    value: str, used: int, allowed_small: bool
) -> None:
    properties = {compact.TARGET_FILE_SIZE_PROPERTY: value}

    resolved = resolve_options("db.t", properties, allow_small_target=allowed_small)

    assert resolved.plan.target_file_size == used
    if used == int(value):
        assert resolved.warnings == ()
    else:
        (warning,) = resolved.warnings
        assert warning.startswith(f"table db.t: property write.target-file-size-bytes={value} ")
        assert "\n" not in warning
    # An explicit target outside the range is still an error, naming the option.
    with pytest.raises(UsageError, match=r"^target_file_size '1KiB'"):
        resolve_options("db.t", properties, target_file_size="1KiB")


def test_a_job_file_section_resolves_like_the_same_keywords() -> None:
    keys = {
        "target_file_size": "64MB",
        "max_group_size": "1GB",
        "commit_every": 2,
        "where": "a > 1",
    }
    section = CompactAction(every="5m", **keys)
    assert resolve_options("db.t", {}, **section.given()) == resolve_options("db.t", {}, **keys)


def test_parallelism_defaults_to_local_cores_for_threads_and_to_the_cluster_for_ray() -> None:
    assert (
        resolve_options("db.t", {}, memory_limit="8GiB").execution.parallelism
        == default_parallelism()
    )
    # Fewer when the memory limit allows no more (one worker under the default limit).
    assert resolve_options("db.t", {}).execution.parallelism == 1
    assert resolve_options("db.t", {}, executor="ray").execution.parallelism is None
    assert resolve_options("db.t", {}, executor="ray", parallelism=3).execution.parallelism == 3


@pytest.mark.parametrize(
    ("keywords", "message", "option"),
    [
        ({"min_input_files": 0}, "min_input_files: must be at least 1, got 0", "min_input_files"),
        ({"target_file_size": "big"}, "cannot read 'big' as a size", "target_file_size"),
        ({"where": "a >"}, "where 'a >': not a valid filter", "where"),
        ({"executor": "spark"}, "executor 'spark': must be one of", "executor"),
        ({"colour": "red"}, "colour: unknown option", "colour"),
    ],
)
def test_bad_options_name_the_option(keywords: dict, message: str, option: str) -> None:
    with pytest.raises(UsageError, match=None) as caught:
        resolve_options("db.t", {}, **keywords)
    assert message in str(caught.value)
    assert option in caught.value.options
