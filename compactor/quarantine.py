"""The files a table's compactions found unreadable, left out of planning until their bytes change.

A table's quarantine is one JSON file beside its metadata,
``<table location>/metadata/compactor-quarantine.json``, so that ``compactor run`` and the daemon
share it, wherever they run. Each entry is a file (a data file, or a delete file: then the data
files it applies to are left out) with its size as the manifest records it, what storage said of
it when it was found unreadable (its size and modification time; both null when it was
missing), why it could not be read, and when a run first found it and last left it out.

A run reads the quarantine before it plans and asks storage about each entry (one metadata
request per file): while storage says the same, the file stays out of the plan; once it says
otherwise (the file was restored, rewritten or uploaded again), the entry is dropped and the
file is planned again. ``compactor quarantine clear`` drops entries by hand. Only a run holding
the table's lease and ``quarantine clear`` write the file, and each write applies its own
changes to the file as it is then, so a clear during a run is not undone. A file that cannot be
parsed counts as empty: its files are tried again, and quarantined anew if still unreadable.
``compactor orphans`` never deletes it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

from pyarrow.fs import FileType
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from compactor.commit.inflight import read_small_file
from compactor.errors import CompactorError, UsageError, first_line, not_writable_error

QUARANTINE_FILE = "compactor-quarantine.json"
VERSION = 1

log = logging.getLogger(__name__)

# What storage says of a file: (size, modification time in epoch ms); (None, None): missing.
Stored = tuple[int | None, int | None]


@dataclass(frozen=True)
class QuarantinedFile:
    """A file left out of planning: ``size`` as its manifest entry records it; ``stored_size``
    and ``stored_mtime_ms`` as storage gave them when it was found (None: missing)."""

    path: str
    size: int
    stored_size: int | None
    stored_mtime_ms: int | None
    reason: str
    first_seen_ms: int
    last_seen_ms: int

    @property
    def stored(self) -> Stored:
        return self.stored_size, self.stored_mtime_ms

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form: ``quarantined_files`` of ``run``, ``inspect``, ``quarantine list``."""
        return asdict(self)


def quarantine_path(table: Table) -> str:
    """Where ``table``'s quarantine is kept."""
    return f"{table.metadata.location.rstrip('/')}/metadata/{QUARANTINE_FILE}"


def stored_state(io: FileIO, path: str) -> Stored:
    """Size and modification time storage gives for ``path`` now; (None, None) when missing.

    Storage other than pyarrow's gives no modification time: None.
    """
    if isinstance(io, PyArrowFileIO):
        scheme, netloc, key = PyArrowFileIO.parse_location(path)
        info = io.fs_by_scheme(scheme, netloc).get_file_info(key)
        if info.type == FileType.NotFound:
            return None, None
        return info.size, int(info.mtime.timestamp() * 1000) if info.mtime else None
    source = io.new_input(path)
    return (len(source), None) if source.exists() else (None, None)


def read_quarantine(table: Table) -> dict[str, QuarantinedFile]:
    """``table``'s quarantine as stored, by path; empty when there is none or it cannot be
    parsed. Read as the run record is, retried on a throttled object store."""
    path = quarantine_path(table)
    text = read_small_file(table, path)
    if text is None:
        return {}
    try:
        return {e["path"]: QuarantinedFile(**e) for e in json.loads(text)["files"]}
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("quarantine %s is damaged (%s): reading it as empty", path, first_line(exc))
        return {}


def write_quarantine(table: Table, files: dict[str, QuarantinedFile]) -> None:
    """Store ``files`` as ``table``'s quarantine; with none, there is no quarantine file."""
    path = quarantine_path(table)
    ordered = [f.to_dict() for _, f in sorted(files.items())]
    payload = json.dumps({"version": VERSION, "files": ordered}, indent=1).encode()
    try:
        if not files:
            table.io.delete(path)
            return
        with table.io.new_output(path).create(overwrite=True) as stream:
            stream.write(payload)
    except FileNotFoundError:
        return  # nothing to delete
    except OSError as exc:
        refused = not_writable_error(".".join(table.name()), exc)
        raise (refused or CompactorError(f"quarantine {path}: {first_line(exc)}")) from exc


def _now_ms() -> int:
    return int(time.time() * 1000)


class Quarantine:
    """A run's view of its table's quarantine: what stays out of its plan, what it adds.

    :meth:`load` reads the quarantine and asks storage about each entry: ``held`` are the
    entries storage still says the same of, ``released`` those it no longer does.
    """

    def __init__(self, table: Table, stored: dict[str, QuarantinedFile]) -> None:
        self.table = table
        self.held: dict[str, QuarantinedFile] = {}
        self.released: dict[str, QuarantinedFile] = {}
        self.added: dict[str, QuarantinedFile] = {}
        for path, entry in stored.items():
            try:
                same = stored_state(table.io, path) == entry.stored
            except OSError as exc:  # storage did not answer: leave it out once more
                log.warning("quarantined file %s: %s; still leaving it out", path, first_line(exc))
                same = True
            (self.held if same else self.released)[path] = entry

    @classmethod
    def load(cls, table: Table) -> Quarantine:
        return cls(table, read_quarantine(table))

    @property
    def excluded(self) -> frozenset[str]:
        """The paths planning leaves out."""
        return frozenset(self.held) | frozenset(self.added)

    @property
    def files(self) -> list[QuarantinedFile]:
        """The entries in effect (held, or added by this run), by path."""
        return [f for _, f in sorted({**self.held, **self.added}.items())]

    def add(self, path: str, size: int, reason: str) -> None:
        """Quarantine ``path`` (``size`` as its manifest records it), found unreadable now."""
        try:
            stored = stored_state(self.table.io, path)
        except OSError:  # unknown: the next run asks again, and quarantines it anew if need be
            stored = (None, None)
        now = _now_ms()
        self.added[path] = QuarantinedFile(path, size, *stored, reason, now, now)

    def save(self) -> None:
        """Apply this run's changes to the quarantine as stored now: the entries released go,
        those held were seen now, those added are added."""
        if not (self.held or self.released or self.added):
            return
        now = _now_ms()
        current = read_quarantine(self.table)
        for path, entry in self.released.items():
            if current.get(path) == entry:
                del current[path]
        for path in self.held:
            if path in current:
                current[path] = replace(current[path], last_seen_ms=now)
        current.update(self.added)
        write_quarantine(self.table, current)
        for path in self.held:
            self.held[path] = replace(self.held[path], last_seen_ms=now)

    @contextmanager
    def saving(self) -> Iterator[Quarantine]:
        """Save on the way out; after a failure, a save that fails too is only logged."""
        try:
            yield self
        except BaseException:
            try:
                self.save()
            except Exception as exc:
                name = ".".join(self.table.name())
                log.warning("quarantine of table %s not saved: %s", name, first_line(exc))
            raise
        self.save()


def clear_quarantine(table: Table, paths: list[str] | None = None) -> list[str]:
    """Drop ``paths`` (default: every entry) from ``table``'s quarantine: the next run plans
    them again. Returns the paths dropped; raises when one of ``paths`` is not quarantined."""
    current = read_quarantine(table)
    wanted = list(current) if paths is None else paths
    unknown = [p for p in wanted if p not in current]
    if unknown:
        raise UsageError(f"table {'.'.join(table.name())}: {unknown[0]} is not quarantined")
    for path in wanted:
        del current[path]
    if wanted:
        write_quarantine(table, current)
    return sorted(wanted)
