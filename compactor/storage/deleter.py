"""Delete files in parallel; on S3, in DeleteObjects batches of up to 1000 keys."""

from __future__ import annotations

import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from pyiceberg.io import (
    AWS_ACCESS_KEY_ID,
    AWS_REGION,
    AWS_SECRET_ACCESS_KEY,
    AWS_SESSION_TOKEN,
    S3_ACCESS_KEY_ID,
    S3_ENDPOINT,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
    S3_SESSION_TOKEN,
    FileIO,
)
from pyiceberg.utils.properties import get_first_property_value

log = logging.getLogger(__name__)

DELETE_THREADS = 8
S3_BATCH = 1000
S3_SCHEMES = {"s3", "s3a", "s3n"}


def _s3_client(io: FileIO) -> Any | None:
    """A boto3 S3 client configured like the table's FileIO, or None without boto3.

    Credentials and region are looked up as pyiceberg's S3 FileIO does: ``s3.*`` first, then
    the ``client.*`` properties shared by all AWS clients.
    """
    try:
        import boto3
    except ImportError:
        return None
    props = io.properties
    return boto3.client(
        "s3",
        endpoint_url=props.get(S3_ENDPOINT),
        aws_access_key_id=get_first_property_value(props, S3_ACCESS_KEY_ID, AWS_ACCESS_KEY_ID),
        aws_secret_access_key=get_first_property_value(
            props, S3_SECRET_ACCESS_KEY, AWS_SECRET_ACCESS_KEY
        ),
        aws_session_token=get_first_property_value(props, S3_SESSION_TOKEN, AWS_SESSION_TOKEN),
        region_name=get_first_property_value(props, S3_REGION, AWS_REGION),
    )


def _delete_one(io: FileIO, path: str) -> str | None:
    try:
        io.delete(path)
    except FileNotFoundError:
        return None
    except Exception as exc:  # any storage error: report the path, keep going
        log.warning("could not delete %s: %s", path, exc)
        return path
    return None


def _delete_s3_batch(client: Any, bucket: str, batch: list[tuple[str, str]]) -> list[str]:
    try:
        response = client.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": key} for key, _ in batch], "Quiet": True}
        )
    except Exception as exc:  # the whole request failed (denied, unreachable): report its paths
        log.warning("could not delete %d objects in s3://%s: %s", len(batch), bucket, exc)
        return [path for _, path in batch]
    by_key = dict(batch)
    failed = [
        by_key[error["Key"]] for error in response.get("Errors", []) if error["Key"] in by_key
    ]
    for error in response.get("Errors", []):
        log.warning("could not delete s3://%s/%s: %s", bucket, error["Key"], error.get("Message"))
    return failed


def delete_files(io: FileIO, paths: list[str], workers: int = DELETE_THREADS) -> list[str]:
    """Delete ``paths``; returns those that could not be deleted (already gone counts as done)."""
    if not paths:
        return []
    s3_keys: dict[str, list[tuple[str, str]]] = defaultdict(list)
    others: list[str] = []
    client = None
    if any(urlsplit(p).scheme in S3_SCHEMES for p in paths):
        client = _s3_client(io)
    for path in paths:
        parts = urlsplit(path)
        if client is not None and parts.scheme in S3_SCHEMES:
            s3_keys[parts.netloc].append((parts.path.lstrip("/"), path))
        else:
            others.append(path)
    failed: list[str] = []
    with ThreadPoolExecutor(min(workers, max(len(paths), 1))) as pool:
        batches = [
            pool.submit(_delete_s3_batch, client, bucket, keys[i : i + S3_BATCH])
            for bucket, keys in s3_keys.items()
            for i in range(0, len(keys), S3_BATCH)
        ]
        failed.extend(p for p in pool.map(lambda p: _delete_one(io, p), others) if p)
        for batch in batches:
            failed.extend(batch.result())
    return failed
