"""Freed pages handed back only past HAND_BACK_AT of the process's memory limit."""

from __future__ import annotations

import pytest

from compactor.options.defaults import HAND_BACK_AT
from compactor.rewrite import freed_memory

MiB = 1 << 20


@pytest.fixture
def released(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A process of 300 MiB resident whose allocator records being asked to hand pages back."""
    calls: list[str] = []

    class Pool:
        def release_unused(self) -> None:
            calls.append("release")

    monkeypatch.setattr(freed_memory, "proc_status_bytes", lambda name: 300 * MiB)
    monkeypatch.setattr(freed_memory.pa, "default_memory_pool", Pool)
    return calls


def test_pages_are_handed_back_past_the_share_of_the_limit(released: list[str]) -> None:
    just_under = int(300 * MiB / HAND_BACK_AT) - MiB  # 300 MiB is past HAND_BACK_AT of it
    assert freed_memory.hand_back_near(just_under) is True
    assert released == ["release"]


def test_no_pages_are_handed_back_within_the_share_or_without_a_limit(
    released: list[str],
) -> None:
    just_over = int(300 * MiB / HAND_BACK_AT) + MiB
    assert freed_memory.hand_back_near(just_over) is False
    assert freed_memory.hand_back_near(None) is False
    assert released == []


def test_nothing_is_handed_back_where_the_resident_memory_is_not_told(
    released: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(freed_memory, "proc_status_bytes", lambda name: None)
    assert freed_memory.hand_back_near(1) is False
    assert released == []


def test_a_block_hands_freed_pages_back_when_it_ends_even_by_an_error(
    released: list[str],
) -> None:
    with pytest.raises(RuntimeError), freed_memory.handed_back_after():
        raise RuntimeError("the rewrite failed")
    assert released == ["release"]
