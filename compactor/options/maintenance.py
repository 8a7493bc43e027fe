"""The options of the maintenance actions, declared once each: snapshot expiry, orphan removal
and delete-file rewriting.

The library, the command line (one flag per field) and job-file sections all take these
models; a field's default and help are written here only.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from compactor.errors import UsageError
from compactor.options.defaults import (
    DEFAULT_BRANCH,
    DEFAULT_DELETE_TARGET_FILE_SIZE,
    DEFAULT_ORPHAN_AGE,
    DEFAULT_TARGET_MANIFEST_SIZE,
)
from compactor.options.fields import BranchName, Cutoff, Filter, Flag, Size
from compactor.sizes import parse_size

DELETE_TARGET_FILE_SIZE_PROPERTY = "write.delete.target-file-size-bytes"


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExpireOptions(_Options):
    """Snapshot expiry (``compactor expire``, ``[expire]`` job sections)."""

    older_than: Cutoff | None = Field(
        None,
        description="Expire snapshots older than this: a duration (12h, 5d, 2w) or an ISO "
        "timestamp. Default: the table's history.expire.max-snapshot-age-ms, else 5d.",
    )
    retain_last: int | None = Field(
        None,
        ge=1,
        description="Keep at least this many snapshots of each branch. Default: the table's "
        "history.expire.min-snapshots-to-keep, else 1.",
    )
    clean_expired_metadata: Annotated[bool, Flag(("--clean-expired-metadata",))] = Field(
        False,
        description="Also remove the partition specs and schemas no retained snapshot uses "
        "(Spark's clean_expired_metadata); never the default spec or current schema.",
    )


class OrphansOptions(_Options):
    """Orphan-file removal (``compactor orphans``, ``[orphans]`` job sections)."""

    # Before older_than: a job section's check of older_than reads it.
    allow_short_older_than: bool = Field(
        False,
        description="Allow --older-than below 1d (for tests and experiments): files of commits "
        "and compaction runs in flight could be deleted.",
    )
    older_than: Cutoff = Field(
        DEFAULT_ORPHAN_AGE,
        description="Only delete files older than this (a duration or an ISO timestamp), so "
        "files of commits in flight are safe. At least 1d unless --allow-short-older-than.",
    )


class RewriteDeletesOptions(_Options):
    """Delete-file rewriting (``compactor rewrite-deletes``, ``[rewrite_deletes]``): equality
    deletes converted, position deletes compacted."""

    target_file_size: Size | None = Field(
        None,
        description="Size at which a new delete file rolls over. Default: the table's "
        "write.delete.target-file-size-bytes, else 64MiB.",
    )
    where: Filter | None = Field(
        None, description="Only partitions this row filter can match, e.g. \"region = 'eu'\"."
    )
    convert_equality_deletes: bool = Field(
        True,
        description="First convert equality deletes into position deletes, reading only the "
        "key columns of the data files they apply to (no data file is rewritten). "
        "--no-convert-equality-deletes leaves them as they are.",
    )
    branch: BranchName = Field(
        DEFAULT_BRANCH,
        description="Rewrite the delete files of this branch of the table: plan from its head "
        "and commit to it; other branches and main stay as they are.",
    )
    memory_limit: Size | None = Field(
        None,
        description="Resident memory the conversion of equality deletes aims to stay under, "
        "as compactor run's (default 384MiB, at least 304MiB): it bounds the key columns read "
        "at once and the positions held before they are written.",
    )


def delete_target_file_size(properties: dict[str, str], given: int | str | None) -> int:
    """The size new position-delete files roll over at: ``given``, else the table's
    ``write.delete.target-file-size-bytes``, else 64 MiB."""
    if given is None:
        given = properties.get(DELETE_TARGET_FILE_SIZE_PROPERTY, DEFAULT_DELETE_TARGET_FILE_SIZE)
        setting = DELETE_TARGET_FILE_SIZE_PROPERTY
    else:
        setting = "target_file_size"
    size = parse_size(given, setting)
    if size <= 0:
        raise UsageError(f"{setting}: must be positive, got {given!r}", "target_file_size")
    return size


MANIFEST_TARGET_SIZE_PROPERTY = "commit.manifest.target-size-bytes"


class RewriteManifestsOptions(_Options):
    """Manifest rewriting (``compactor rewrite-manifests``, ``[rewrite_manifests]``)."""

    spec_id: int | None = Field(
        None,
        ge=0,
        description="Only rewrite the manifests of this partition spec. Default: every spec's.",
    )
    target_manifest_size: Size | None = Field(
        None,
        description="Size of the manifests written. Default: the table's "
        "commit.manifest.target-size-bytes, else 8MiB.",
    )


def target_manifest_size(properties: dict[str, str], given: int | str | None) -> int:
    """The size rewritten manifests aim at: ``given``, else the table's
    ``commit.manifest.target-size-bytes``, else 8 MiB."""
    if given is None:
        given = properties.get(MANIFEST_TARGET_SIZE_PROPERTY, DEFAULT_TARGET_MANIFEST_SIZE)
        setting = MANIFEST_TARGET_SIZE_PROPERTY
    else:
        setting = "target_manifest_size"
    size = parse_size(given, setting)
    if size <= 0:
        raise UsageError(f"{setting}: must be positive, got {given!r}", "target_manifest_size")
    return size
