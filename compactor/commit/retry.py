"""Which answers of the catalog to a commit are refusals, and how often to retry them.

Only a definite refusal lets a run discard what it wrote (:func:`is_refusal`); of those, the
ones that say the table moved on (:func:`is_retryable`) are retried after validating again, as
often and as long as the table's ``commit.retry.*`` properties allow (:class:`RetryPolicy`,
Iceberg's defaults). Every commit compactor makes — a rewrite, a delete rewrite, an expiry —
follows these rules.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pyiceberg.exceptions import (
    BadRequestError,
    CommitFailedException,
    ForbiddenError,
    NoSuchTableError,
    UnauthorizedError,
)
from pyiceberg.table import Table, TableProperties
from pyiceberg.utils.properties import property_as_int

# What catalogs say when they refuse a snapshot built on a table state that has moved on.
STALE_SNAPSHOT_REFUSALS = (
    "older than last sequence number",  # pyiceberg, Iceberg Java (REST)
    "first row id smaller than the table's next-row-id",  # pyiceberg, format 3
    "first-row-id is behind table next-row-id",  # Iceberg Java (REST), format 3
)


@dataclass
class RetryPolicy:
    """Commit retries, from the table's ``commit.retry.*`` properties (Iceberg defaults)."""

    num_retries: int = TableProperties.COMMIT_NUM_RETRIES_DEFAULT
    min_wait_ms: int = 100
    max_wait_ms: int = 60_000
    total_timeout_ms: int = 1_800_000

    @classmethod
    def for_table(cls, table: Table) -> RetryPolicy:
        props = table.metadata.properties

        def get(name: str, default: int) -> int:
            return max(0, property_as_int(props, name, default) or 0)

        return cls(
            num_retries=get(TableProperties.COMMIT_NUM_RETRIES, cls.num_retries),
            min_wait_ms=get(TableProperties.COMMIT_MIN_RETRY_WAIT_MS, cls.min_wait_ms),
            max_wait_ms=get(TableProperties.COMMIT_MAX_RETRY_WAIT_MS, cls.max_wait_ms),
            total_timeout_ms=get(TableProperties.COMMIT_TOTAL_RETRY_TIME_MS, cls.total_timeout_ms),
        )

    def wait_s(self, attempt: int) -> float:
        wait = min(self.max_wait_ms, self.min_wait_ms * 2**attempt)
        return wait * (0.5 + random.random() / 2) / 1000


def is_retryable(exc: BaseException) -> bool:
    """Whether the catalog refused a commit because the table moved on: validate and retry.

    A conflict (409), or a sequence number or (format 3) row ids another branch's commit took
    meanwhile: the catalog applies the updates to the table as it is now and refuses them
    (pyiceberg's SQL catalog: ValueError; a REST server: 400 ValidationException).
    """
    if isinstance(exc, CommitFailedException):
        return True
    return isinstance(exc, ValueError | BadRequestError) and any(
        stale in str(exc) for stale in STALE_SNAPSHOT_REFUSALS
    )


def is_refusal(exc: BaseException) -> bool:
    """Whether the catalog's answer proves the commit was not applied and never will be.

    Only a definite refusal: a conflict or stale-requirement refusal (:func:`is_retryable`),
    or a REST 400, 401, 403 or 404, which the catalog answers before applying anything (the
    failures Iceberg Java's ``SnapshotProducer`` cleans up after). Everything else — a 5xx,
    a timeout, a reset connection, an unreadable answer, any other exception — leaves the
    commit's outcome unknown.
    """
    return is_retryable(exc) or isinstance(
        exc, BadRequestError | UnauthorizedError | ForbiddenError | NoSuchTableError
    )
