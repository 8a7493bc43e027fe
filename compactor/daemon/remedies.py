"""The cheapest remedy for a table's delete files, partition by partition.

Every reader anti-joins each data file with the equality deletes that apply to it, and merges
the position deletes that reference it. Per partition, the daemon picks:

- **compaction** when the partition's data files are small anyway (a compaction rewrites every
  one of them): the rewrite applies the deletes and drops the equality-delete files with them,
  where converting first would read the same files for nothing;
- **conversion** (``rewrite_deletes`` converting equality deletes) once the partition holds
  ``min_equality_delete_files`` equality-delete files over data files a compaction leaves
  alone: only their key columns are read, no data file is rewritten;
- **rewrite_deletes** once it holds ``min_position_delete_files`` Parquet position-delete
  files (format 2; format 3 keeps deletion vectors, which only a compaction removes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from compactor.daemon.jobfiles import RewriteDeletesAction


@dataclass(frozen=True)
class PartitionFiles:
    """A partition holding delete files: its data files and its delete files by kind."""

    partition: str
    data_files: int
    small_files: int  # the data files a compaction would rewrite now
    equality_delete_files: int
    position_delete_files: int

    @property
    def rewritten_anyway(self) -> bool:
        """Whether a compaction rewrites every data file of the partition."""
        return 0 < self.data_files == self.small_files


@dataclass(frozen=True)
class Remedies:
    """The partitions due for each remedy of their delete files."""

    compact: tuple[PartitionFiles, ...] = ()
    convert: tuple[PartitionFiles, ...] = ()
    rewrite_deletes: tuple[PartitionFiles, ...] = ()
    # Equality-delete files left to conversion: over data files no compaction rewrites.
    left_to_conversion: int = 0


def choose_remedies(
    partitions: Iterable[PartitionFiles],
    format_version: int,
    deletes: RewriteDeletesAction | None,
    compacts: bool,
) -> Remedies:
    """The remedy of each partition, for a job with the ``deletes`` section (None: no
    ``[rewrite_deletes]``) and, when ``compacts``, a ``[compact]`` section."""
    if deletes is None:
        return Remedies()
    compact: list[PartitionFiles] = []
    convert: list[PartitionFiles] = []
    rewrite_deletes: list[PartitionFiles] = []
    left_to_conversion = 0
    for part in partitions:
        rewritten = compacts and part.rewritten_anyway
        if deletes.convert_equality_deletes and not rewritten:
            left_to_conversion += part.equality_delete_files
        if deletes.convert_equality_deletes and (
            part.equality_delete_files >= deletes.min_equality_delete_files
        ):
            (compact if rewritten else convert).append(part)
        if format_version < 3 and part.position_delete_files >= deletes.min_position_delete_files:
            rewrite_deletes.append(part)
    return Remedies(tuple(compact), tuple(convert), tuple(rewrite_deletes), left_to_conversion)


def _partitions(found: tuple[PartitionFiles, ...], files: int, kind: str) -> str:
    """``12 equality-delete files in 3 partitions (most: 'region=eu', 6)``."""
    most = max(found, key=lambda p: (getattr(p, kind), p.partition))
    where = f"{len(found)} partitions" if len(found) > 1 else "1 partition"
    name = kind.replace("_files", "").replace("_", "-") + " files"
    return f"{files} {name} in {where} (most: {most.partition!r}, {getattr(most, kind)})"


def compaction_reasons(remedies: Remedies, deletes: RewriteDeletesAction) -> list[str]:
    """Why the equality deletes make a compaction due: over data files it rewrites anyway."""
    if not remedies.compact:
        return []
    files = sum(p.equality_delete_files for p in remedies.compact)
    return [
        f"{_partitions(remedies.compact, files, 'equality_delete_files')} whose data files a "
        f"compaction rewrites anyway >= min_equality_delete_files "
        f"{deletes.min_equality_delete_files}"
    ]


def rewrite_deletes_reasons(remedies: Remedies, deletes: RewriteDeletesAction) -> list[str]:
    """Why ``rewrite_deletes`` is due: equality deletes to convert, position deletes to merge."""
    reasons = []
    if remedies.convert:
        files = sum(p.equality_delete_files for p in remedies.convert)
        reasons.append(
            f"{_partitions(remedies.convert, files, 'equality_delete_files')} >= "
            f"min_equality_delete_files {deletes.min_equality_delete_files}: converted"
        )
    if remedies.rewrite_deletes:
        files = sum(p.position_delete_files for p in remedies.rewrite_deletes)
        reasons.append(
            f"{_partitions(remedies.rewrite_deletes, files, 'position_delete_files')} >= "
            f"min_position_delete_files {deletes.min_position_delete_files}"
        )
    return reasons
