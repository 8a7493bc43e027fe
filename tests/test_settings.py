"""Defaults that depend on the machine: groups rewritten at once follow the CPUs allowed."""

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
