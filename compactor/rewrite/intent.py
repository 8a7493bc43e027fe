"""Intent files: each rewrite task attempt lists, before creating them, the files it will write.

A task attempt of run ``R`` for task ``T`` keeps ``<table>/metadata/compactor-intent-R-tT-X.json``
where ``X`` is 8 random hex digits chosen per attempt (an executor may retry a task: a retry
must not erase the list of the attempt before it). Like the run record, the file alternates
between two slots, ``...-X.0.json`` and ``...-X.1.json``, with a sequence number: a write torn
by a crash damages one slot, and the other still lists every file created before it.

A task never deletes its intent files. The run's driver does, at the end of the run, once every
file they list is committed or deleted; a run that is killed leaves them, and the next run
(whose record carries the killed run's id) deletes what they list that no snapshot references,
then the intent files. The orphan sweep keeps them, and what they list, while their run has a
record. See :mod:`compactor.commit.inflight`.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Iterable

from pyiceberg.io import FileIO

from compactor.storage.listing import list_prefix

log = logging.getLogger(__name__)

INTENT_PREFIX = "compactor-intent-"


def intent_prefix(table_location: str, run_id: str) -> str:
    """Every intent file of run ``run_id`` starts with this location."""
    return f"{table_location.rstrip('/')}/metadata/{INTENT_PREFIX}{run_id}-"


class IntentLog:
    """The intent file of one task attempt; :meth:`add` records a path before its file exists."""

    def __init__(self, io: FileIO, table_location: str, run_id: str, task_id: int) -> None:
        self._io = io
        stem = f"{intent_prefix(table_location, run_id)}t{task_id}-{secrets.token_hex(4)}"
        self.paths = (f"{stem}.0.json", f"{stem}.1.json")
        self._header = {"run_id": run_id, "task_id": task_id}
        self._files: list[str] = []
        self._seq = 0
        self._lock = threading.Lock()

    def add(self, path: str) -> None:
        """Record ``path``; call before creating the file, so a crash never leaves it untracked."""
        with self._lock:
            self._files.append(path)
            self._seq += 1
            payload = json.dumps({**self._header, "seq": self._seq, "files": self._files})
            slot = self.paths[self._seq % len(self.paths)]
            with self._io.new_output(slot).create(overwrite=True) as stream:
                stream.write(payload.encode())


def intent_files(io: FileIO, table_location: str, run_ids: Iterable[str]) -> list[str]:
    """The intent files of the given runs, as stored now (one listing of ``metadata/``)."""
    ids = sorted(set(run_ids))
    if not ids:
        return []
    found = list_prefix(io, f"{table_location.rstrip('/')}/metadata/{INTENT_PREFIX}")
    marks = tuple(f"/{INTENT_PREFIX}{run_id}-" for run_id in ids)
    return [path for path in found if any(mark in path for mark in marks)]


def listed_files(io: FileIO, paths: Iterable[str]) -> list[str]:
    """Every file the given intent files list, in order, once; a torn slot is skipped."""
    files: dict[str, None] = {}
    for path in paths:
        try:
            with io.new_input(path).open() as stream:
                listed = json.loads(stream.read())["files"]
        except FileNotFoundError:
            continue  # deleted meanwhile, by its run's end
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable intent file %s (%s): ignoring this slot", path, exc)
            continue
        files.update(dict.fromkeys(str(p) for p in listed))
    return list(files)
