"""The candidate files a run keeps while planning, derived from its memory limit."""

from __future__ import annotations

from compactor.options import resolve_options
from compactor.options.compact import planning_budget
from compactor.options.defaults import DEFAULT_MEMORY_LIMIT, MIN_MEMORY_LIMIT
from compactor.sizes import GiB, MiB


def test_the_budget_is_half_the_limit_past_the_allowance_at_900_bytes_a_candidate() -> None:
    assert planning_budget(DEFAULT_MEMORY_LIMIT) == (384 - 160) * MiB // 2 // 900 == 130_489
    assert planning_budget(GiB) == (1024 - 160) * MiB // 2 // 900
    assert 80_000 < planning_budget(MIN_MEMORY_LIMIT) < 100_000


def test_the_plan_options_carry_the_budget_of_the_memory_limit() -> None:
    default = resolve_options("db.t", {}).plan
    larger = resolve_options("db.t", {}, memory_limit="1GiB").plan
    assert default.max_candidate_files == planning_budget(DEFAULT_MEMORY_LIMIT)
    assert larger.max_candidate_files == planning_budget(GiB) > default.max_candidate_files
