"""Fixtures of the system tests: a Ray cluster on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from support.ray_cluster import RayCluster


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A real Ray cluster on loopback (tests/support/ray_cluster.py): a head and a worker node,
    one CPU each, started once; every process stopped at the end."""
    from support.ray_cluster import ray_cluster as start_cluster

    with start_cluster(workers=1) as cluster:
        yield cluster
