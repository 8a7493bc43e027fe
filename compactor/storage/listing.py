"""List the files under a location, on a local disk or an object store."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyarrow.fs import FileInfo, FileSelector, FileType
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from compactor.errors import UnsupportedTableError
from compactor.storage.s3_client import S3_SCHEMES, s3_client


@dataclass(frozen=True)
class StoredFile:
    """A file found in storage; ``symlink`` entries are reported, never followed or deleted."""

    location: str
    size: int
    mtime_ms: int
    symlink: bool = False


def _list_local(root: str) -> Iterator[StoredFile]:
    """Regular files and symlinks under ``root``, a directory at a time: a directory of a million
    files streams through without its names held in a list."""
    pending = [root]
    while pending:
        try:
            entries = os.scandir(pending.pop())
        except OSError:
            continue  # gone, or not ours to read: nothing listed there is deleted
        with entries:
            for entry in entries:
                if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    yield StoredFile(
                        f"file://{entry.path}",
                        info.st_size,
                        int(info.st_mtime * 1000),
                        symlink=stat.S_ISLNK(info.st_mode),
                    )
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)


def _list_s3(client: Any, scheme: str, bucket: str, path: str) -> Iterator[StoredFile]:
    """Objects under ``path`` (``bucket/key prefix``), a page of ListObjectsV2 at a time
    (pyarrow's listing returns every object's info at once: about 300 bytes each)."""
    prefix = path.removeprefix(bucket).strip("/") + "/"
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            key = item["Key"]
            if not key.endswith("/"):  # a directory marker, not a file
                modified = int(item["LastModified"].timestamp() * 1000)
                yield StoredFile(f"{scheme}://{bucket}/{key}", item["Size"], modified)


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
    if scheme in S3_SCHEMES and isinstance(io, PyArrowFileIO):
        client = s3_client(io)
        if client is not None:
            yield from _list_s3(client, scheme, netloc, path)
            return
    for info in _listing(io, root, scheme, netloc, path, recursive=True):
        if info.type == FileType.File:
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            yield StoredFile(f"{scheme}://{info.path}", info.size or 0, int(mtime * 1000))
