"""Every file a table's metadata can reach: the ground truth for deciding what may be deleted."""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
from pyiceberg.manifest import DataFileContent, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from compactor.iceberg.manifest_decoder import planning_entries, read_in_order
from compactor.storage.paths import UnsafePathError, location_key

MANIFEST_LIST = "manifest_lists"
MANIFEST = "manifests"
STATISTICS = "statistics"
CONTENT_KINDS = {
    DataFileContent.DATA: "data_files",
    DataFileContent.POSITION_DELETES: "position_delete_files",
    DataFileContent.EQUALITY_DELETES: "equality_delete_files",
}


@dataclass(frozen=True)
class FileRef:
    """A file named by table metadata: its kind and, when the metadata says, its size."""

    location: str
    kind: str
    size: int | None


@dataclass
class References:
    """Files reachable from a set of snapshots, keyed by the location the metadata spells."""

    files: dict[str, FileRef] = field(default_factory=dict)

    def add(self, location: str, kind: str, size: int | None) -> None:
        self.files.setdefault(location, FileRef(location, kind, size))

    def all(self) -> set[str]:
        return set(self.files)

    def keys(self) -> set[str]:
        """Comparable keys (see :func:`compactor.storage.paths.location_key`) of every reachable file.

        A location that cannot be normalised is kept verbatim, so it still protects its file.
        """
        return {reference_key(location) for location in self.files}


def reference_key(location: str) -> str:
    """The key a referenced location protects its file by: its location key, or the location
    verbatim when it cannot be normalised (it still protects that file)."""
    try:
        return location_key(location)
    except UnsafePathError:
        return location


def table_references(table: Table, snapshots: Iterable[Snapshot] | None = None) -> References:
    """Files reachable from ``snapshots`` (default: every snapshot in the table's metadata).

    Live entries (ADDED, EXISTING) count: a DELETED entry is not part of its snapshot, and a
    retained parent that still reads that file lists it as live itself. Statistics and
    partition-statistics files the metadata lists count unless they belong to a snapshot of the
    table left out of ``snapshots`` (an expiry drops those entries with their snapshots): a
    file the metadata lists, even for a snapshot it no longer has, is never garbage.
    """
    refs, manifests = snapshot_references(table, snapshots)
    for ref in manifest_file_refs(table, manifests):
        refs.add(ref.location, ref.kind, ref.size)
    return refs


def snapshot_references(
    table: Table, snapshots: Iterable[Snapshot] | None = None
) -> tuple[References, list[ManifestFile]]:
    """What :func:`table_references` finds without reading manifests (manifest lists,
    manifests, statistics files), and the manifests, whose files it does not list."""
    refs = References()
    metadata, io = table.metadata, table.io
    chosen = list(metadata.snapshots if snapshots is None else snapshots)
    ids = {s.snapshot_id for s in chosen}
    manifests: dict[str, ManifestFile] = {}
    for snapshot in chosen:
        refs.add(snapshot.manifest_list, MANIFEST_LIST, None)
        for manifest in snapshot.manifests(io):
            manifests.setdefault(manifest.manifest_path, manifest)
    for manifest in manifests.values():
        refs.add(manifest.manifest_path, MANIFEST, manifest.manifest_length)
    known = {s.snapshot_id for s in metadata.snapshots}
    for stats in [*metadata.statistics, *metadata.partition_statistics]:
        if stats.snapshot_id in ids or stats.snapshot_id not in known:
            refs.add(stats.statistics_path, STATISTICS, stats.file_size_in_bytes)
    return refs, list(manifests.values())


def manifest_file_refs(table: Table, manifests: Iterable[ManifestFile]) -> Iterator[FileRef]:
    """The file of every live entry of ``manifests``, read a few at a time (their column
    metrics skipped: a million entries stream through in seconds)."""
    io, version = table.io, table.metadata.format_version

    def entries(manifest: ManifestFile) -> list[FileRef]:
        return [
            FileRef(
                e.data_file.file_path,
                CONTENT_KINDS[e.data_file.content],
                e.data_file.file_size_in_bytes,
            )
            for e in planning_entries(io, manifest, version)
        ]

    for _, found in read_in_order(entries, manifests):
        yield from found


class KeyDigests:
    """A set of location keys held as 8-byte digests in one sorted array: 8 bytes a key, where
    a set of the keys as strings takes about 200.

    Membership is by digest, so a key that is not in the set but shares a digest with one that is
    (odds about n * m / 2^64 for n keys looked up against m: 5e-8 for a million each) is found:
    a file so matched is kept, never deleted. No key in the set is ever missed.
    """

    def __init__(self, keys: Iterable[str]) -> None:
        digests = array("q", map(key_digest, keys))
        self._sorted = np.unique(np.frombuffer(digests, dtype=np.int64))

    def __len__(self) -> int:
        return len(self._sorted)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        digest = np.int64(key_digest(key))
        at = int(np.searchsorted(self._sorted, digest))
        return at < len(self._sorted) and self._sorted[at] == digest


def key_digest(key: str) -> int:
    """The 8-byte BLAKE2b digest of ``key``, as a signed integer."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def referenced_keys(table: Table, also: Iterable[str] = ()) -> KeyDigests:
    """The :func:`reference_key` of every file :func:`table_references` finds, and the keys
    ``also``, as digests: a table of a million files takes about 8 MB."""
    refs, manifests = snapshot_references(table)
    found = (reference_key(ref.location) for ref in manifest_file_refs(table, manifests))
    return KeyDigests(itertools.chain(refs.keys(), found, also))
