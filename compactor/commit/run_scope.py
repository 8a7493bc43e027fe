"""One run's hold on a table, for every action that writes files: lease, record, clean-up.

``with RunScope(table, run_id, ttl_s) as scope:`` takes the table's lease (backing off with
:class:`~compactor.commit.inflight.LeaseHeldError` when a live run holds it, cleaning up after an
abandoned one otherwise), and on the way out deletes what the run wrote and did not commit —
the files its tasks' intent files list — then releases the record. Commits go through
:meth:`RunScope.committing`: while a commit's outcome is unknown (the catalog's answer was lost,
or the run was interrupted inside the call) nothing is deleted and the record is left, expired,
for the next run to settle (:mod:`compactor.commit.inflight`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType

from pyiceberg.table import Table

from compactor import __version__
from compactor.commit.inflight import PendingCommit, RunLease, remove_run_files
from compactor.commit.snapshot_writer import (
    SNAPSHOT_PROPERTY_ACTION,
    SNAPSHOT_PROPERTY_RUN_ID,
    SNAPSHOT_PROPERTY_TOOL,
)
from compactor.errors import CommitStateUnknownError


def new_run_id() -> str:
    """A run id: names the run's files, intent files and snapshots."""
    return uuid.uuid4().hex[:12]


class RunScope:
    """The lease, the run record, the intent files and "clean up unless a commit is in doubt"."""

    def __init__(self, table: Table, run_id: str, ttl_s: float) -> None:
        self.table, self.run_id = table, run_id
        self.lease = RunLease(table, run_id, ttl_s)
        self.recovered: list[str] = []  # files of abandoned runs deleted
        self.in_doubt: list[PendingCommit] = []  # commits of abandoned runs that may still land
        self._writing = False
        self._committed: set[str] = set()
        self._commit_in_doubt = False

    @property
    def journal(self) -> RunLease:
        """Where commits record their files and catalog calls first (see ``commit_on_branch``)."""
        return self.lease

    @property
    def lost(self) -> bool:
        """Whether another run took the table over: this run may no longer commit."""
        return self.lease.lost

    def snapshot_properties(self, action: str | None = None) -> dict[str, str]:
        """The summary properties of the snapshots this run commits: compactor's version, the
        run id and, for an action other than compaction, the action."""
        properties = {SNAPSHOT_PROPERTY_TOOL: __version__, SNAPSHOT_PROPERTY_RUN_ID: self.run_id}
        if action is not None:
            properties[SNAPSHOT_PROPERTY_ACTION] = action
        return properties

    def start_writing(self) -> None:
        """From now on the run may leave files: the way out deletes those not committed."""
        self._writing = True

    def keep(self, paths: Iterable[str]) -> None:
        """Files the table now references: never cleaned up."""
        self._committed.update(paths)

    @contextmanager
    def committing(self) -> Iterator[None]:
        """Around one commit: unless it ends or fails for certain, every file of the run stays.

        A :class:`CommitStateUnknownError` or an interrupt (``KeyboardInterrupt``) leaves the
        commit in doubt; record its files with :meth:`keep` inside the block once it landed.
        """
        self._commit_in_doubt = True
        try:
            yield
        except CommitStateUnknownError:
            raise
        except Exception:
            self._commit_in_doubt = False  # refused for certain, or failed before the call
            raise
        self._commit_in_doubt = False

    def __enter__(self) -> RunScope:
        self.lease.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        undeleted: list[str] | None = None  # until the clean-up has run to its end
        try:
            if not self._commit_in_doubt:
                undeleted = self._clean_up() if self._writing else []
        finally:
            # Keep the record, expired, while files may remain: the next run finishes the work.
            if undeleted == []:
                self.lease.release()
            else:
                self.lease.abandon()
            self.recovered, self.in_doubt = self.lease.recovered, self.lease.in_doubt

    def _clean_up(self) -> list[str]:
        """Delete what the run's tasks wrote and did not commit, then their intent files;
        returns the files that could not be deleted."""
        _, failed = remove_run_files(self.table, [self.run_id], [], lambda: self._committed)
        return failed
