"""Fixtures of the system tests: a Ray cluster on loopback. Every system test is marked slow: they
run whole commands, daemons and clusters, so `make test` runs them and `make test-quick` does not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from support.ray_cluster import RayCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of this folder slow."""
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A real Ray cluster on loopback (tests/support/ray_cluster.py): a head and a worker node,
    one CPU each, started once; every process stopped at the end."""
    from support.ray_cluster import ray_cluster as start_cluster

    with start_cluster(workers=1) as cluster:
        yield cluster
