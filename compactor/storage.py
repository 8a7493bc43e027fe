"""List the files under a location, on a local disk or an object store."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from pyarrow.fs import FileSelector, FileType
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
        for name in files + subdirs:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            is_link = stat.S_ISLNK(info.st_mode)
            if is_link or (name in files and stat.S_ISREG(info.st_mode)):
                yield StoredFile(
                    f"file://{path}", info.st_size, int(info.st_mtime * 1000), symlink=is_link
                )


def list_files(io: FileIO, root: str) -> Iterator[StoredFile]:
    """Every file under ``root`` (recursively), as locations in ``root``'s own scheme."""
    scheme, netloc, path = PyArrowFileIO.parse_location(root)
    if scheme == "file":
        yield from _list_local(path)
        return
    if not isinstance(io, PyArrowFileIO):
        raise UnsupportedTableError(
            f"listing {root} needs pyiceberg's PyArrowFileIO (set py-io-impl), not {type(io).__name__}"
        )
    filesystem = io.fs_by_scheme(scheme, netloc)
    selector = FileSelector(path.rstrip("/"), recursive=True, allow_not_found=True)
    for info in filesystem.get_file_info(selector):
        if info.type == FileType.File:
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            yield StoredFile(f"{scheme}://{info.path}", info.size or 0, int(mtime * 1000))
