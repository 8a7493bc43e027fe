"""Defaults that depend on the machine: groups rewritten at once follow the CPUs and memory allowed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compactor import options as settings


@pytest.mark.parametrize(
    ("cpu_max", "limit"),
    [("max 100000\n", None), ("100000 100000\n", 1), ("150000 100000\n", 2), ("50000 100000", 1)],
)
def test_parallelism_follows_affinity_and_the_cgroup_cpu_limit(
    cpu_max: str, limit: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text(cpu_max)
    monkeypatch.setattr(settings, "CGROUP_CPU_MAX", tmp_path / "cpu.max")
    expected = allowed if limit is None else min(allowed, limit)
    assert settings.default_parallelism() == expected


def test_parallelism_without_cgroup_files_is_the_affinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settings, "CGROUP_CPU_MAX", tmp_path / "absent")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert settings.default_parallelism() == 1


def test_the_memory_limit_sizes_each_workers_buffers_and_caps_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(settings, "default_parallelism", lambda: 8)
    mib = settings.MiB

    tight = settings.resolve_options("db.t", {}, memory_limit="448MiB")
    roomy = settings.resolve_options("db.t", {}, memory_limit="4GiB")
    pinned = settings.resolve_options("db.t", {}, memory_limit="448MiB", parallelism=1)
    crowded = settings.resolve_options("db.t", {}, memory_limit="448MiB", parallelism=8)
    on_ray = settings.resolve_options(
        "db.t", {}, memory_limit="448MiB", parallelism=4, executor="ray"
    )

    # 288 MiB past the process allowance: two workers of 96 MiB overhead + three 16 MiB shares.
    assert (tight.parallelism, tight.read_ahead, tight.row_group_size) == (2, 16 * mib, 16 * mib)
    assert roomy.parallelism == 8
    assert roomy.row_group_size == settings.DEFAULT_ROW_GROUP_SIZE  # the table's size caps it
    assert (pinned.parallelism, pinned.read_ahead) == (1, 64 * mib)  # (288 - 96) / 3
    assert (crowded.parallelism, crowded.read_ahead) == (8, settings.MIN_SHARE)
    # Each Ray task runs in a process of its own: the limit is that process's.
    assert (on_ray.parallelism, on_ray.read_ahead) == (4, 64 * mib)
    assert settings.resolve_options("db.t", {}).memory_limit == settings.DEFAULT_MEMORY_LIMIT


def test_a_memory_limit_below_the_minimum_is_a_usage_error_naming_it() -> None:
    with pytest.raises(
        settings.UsageError, match=r"^memory_limit: 100.0 MiB is below the minimum 304.0 MiB"
    ):
        settings.resolve_options("db.t", {}, memory_limit="100MiB")


@pytest.mark.parametrize(
    ("value", "used", "allowed_small"),
    [
        ("1024", settings.MIN_TARGET_FILE_SIZE, False),
        (str(2**40), settings.MAX_TARGET_FILE_SIZE, False),
        ("0", settings.MIN_TARGET_FILE_SIZE, False),
        ("1024", 1024, True),
    ],
    ids=["tiny", "huge", "zero", "tiny-allowed"],
)
def test_a_table_target_outside_the_range_uses_the_nearest_bound_with_a_warning(
    value: str, used: int, allowed_small: bool
) -> None:
    properties = {settings.TARGET_FILE_SIZE_PROPERTY: value}

    resolved = settings.resolve_options("db.t", properties, allow_small_target=allowed_small)

    assert resolved.target_file_size == used
    if used == int(value):
        assert resolved.warnings == ()
    else:
        (warning,) = resolved.warnings
        assert warning.startswith(f"table db.t: property write.target-file-size-bytes={value} ")
        assert "\n" not in warning
    # An explicit target outside the range is still an error, naming the option.
    with pytest.raises(settings.UsageError, match=r"^target_file_size '1KiB'"):
        settings.resolve_options("db.t", properties, target_file_size="1KiB")
