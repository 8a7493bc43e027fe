"""List the files under a location, on a local disk or an object store."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from pyarrow.fs import FileInfo, FileSelector, FileType
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from compactor.errors import UnsupportedTableError


@dataclass(frozen=True)
class StoredFile:
    """A file found in storage; ``symlink`` entries are reported, never followed or deleted."""

    location: str
    size: int
    mtime_ms: int
    symlink: bool = False


def _list_local(root: str) -> Iterator[StoredFile]:
    for directory, subdirs, files in os.walk(root, followlinks=False):
        regular = set(files)  # a directory of a million files: no list search per file
        for name in files + subdirs:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            is_link = stat.S_ISLNK(info.st_mode)
            if is_link or (name in regular and stat.S_ISREG(info.st_mode)):
                yield StoredFile(
                    f"file://{path}", info.st_size, int(info.st_mtime * 1000), symlink=is_link
                )


def _listing(
    io: FileIO, root: str, scheme: str, netloc: str, path: str, recursive: bool
) -> list[FileInfo]:
    if not isinstance(io, PyArrowFileIO):
        raise UnsupportedTableError(
            f"listing {root} needs pyiceberg's PyArrowFileIO (set py-io-impl), not {type(io).__name__}"
        )
    filesystem = io.fs_by_scheme(scheme, netloc)
    selector = FileSelector(path.rstrip("/"), recursive=recursive, allow_not_found=True)
    return filesystem.get_file_info(selector)


def list_prefix(io: FileIO, prefix: str) -> list[str]:
    """Locations of the files directly in ``prefix``'s directory whose names start like it.

    One listing of that directory (not of what is below it), in ``prefix``'s own scheme.
    """
    scheme, netloc, path = PyArrowFileIO.parse_location(prefix)
    directory, _, start = path.rpartition("/")
    if scheme == "file":
        try:
            names = [
                e.name for e in os.scandir(directory or "/") if e.is_file(follow_symlinks=False)
            ]
        except FileNotFoundError:
            return []
        return sorted(f"file://{directory}/{name}" for name in names if name.startswith(start))
    found = _listing(io, prefix, scheme, netloc, directory, recursive=False)
    return sorted(
        f"{scheme}://{info.path}"
        for info in found
        if info.type == FileType.File and info.base_name.startswith(start)
    )


def list_files(io: FileIO, root: str) -> Iterator[StoredFile]:
    """Every file under ``root`` (recursively), as locations in ``root``'s own scheme."""
    scheme, netloc, path = PyArrowFileIO.parse_location(root)
    if scheme == "file":
        yield from _list_local(path)
        return
    for info in _listing(io, root, scheme, netloc, path, recursive=True):
        if info.type == FileType.File:
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            yield StoredFile(f"{scheme}://{info.path}", info.size or 0, int(mtime * 1000))
