"""Delete files in parallel; on S3, in DeleteObjects batches of up to 1000 keys.

A DeleteObjects request can succeed (HTTP 200) while failing for some of its keys: those come
back as per-key ``<Error>`` entries. Keys failing with a transient code (``SlowDown``,
``InternalError``, ...) are sent again in a new request, a few times; the others, and those
still failing, are returned as failed (and logged), never counted as deleted. Whole requests
that fail are retried by botocore itself; what still fails is returned as failed too.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pyiceberg.io import FileIO

from compactor.storage.s3_client import S3_SCHEMES, s3_client

log = logging.getLogger(__name__)

DELETE_THREADS = 8
S3_BATCH = 1000
# Per-key DeleteObjects error codes worth another request; any other code is final.
TRANSIENT_KEY_ERRORS = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout"}
KEY_RETRIES = 2  # further requests for keys that failed transiently
KEY_RETRY_BASE_S = 0.2  # full-jitter backoff: up to 0.2 s, then up to 0.4 s


def _delete_one(io: FileIO, path: str) -> str | None:
    try:
        io.delete(path)
    except FileNotFoundError:
        return None
    except Exception as exc:  # any storage error: report the path, keep going
        log.warning("could not delete %s: %s", path, exc)
        return path
    return None


def _delete_s3_request(
    client: Any, bucket: str, batch: list[tuple[str, str]]
) -> tuple[list[str], list[tuple[str, str]]]:
    """One DeleteObjects request: (paths failed for good, (key, path) failed transiently)."""
    try:
        response = client.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": key} for key, _ in batch], "Quiet": True}
        )
    except Exception as exc:  # the whole request failed (denied, unreachable): report its paths
        log.warning("could not delete %d objects in s3://%s: %s", len(batch), bucket, exc)
        return [path for _, path in batch], []
    by_key = dict(batch)
    failed: list[str] = []
    transient: list[tuple[str, str]] = []
    codes: Counter[str] = Counter()
    for error in response.get("Errors", []):
        key, code = error.get("Key", ""), error.get("Code", "")
        codes[code] += 1
        log.debug("could not delete s3://%s/%s: %s %s", bucket, key, code, error.get("Message"))
        if key not in by_key:
            log.warning(
                "DeleteObjects in s3://%s reported an unknown key %r: %s", bucket, key, code
            )
        elif code in TRANSIENT_KEY_ERRORS:
            transient.append((key, by_key[key]))
        else:
            failed.append(by_key[key])
    if codes:
        example = response["Errors"][0]
        log.warning(
            "DeleteObjects in s3://%s: %d of %d keys failed (%s), e.g. %s: %s",
            bucket,
            sum(codes.values()),
            len(batch),
            ", ".join(f"{code or 'no code'} x{n}" for code, n in sorted(codes.items())),
            example.get("Key"),
            example.get("Message"),
        )
    return failed, transient


def _delete_s3_batch(client: Any, bucket: str, batch: list[tuple[str, str]]) -> list[str]:
    """Delete one batch; keys failing transiently are sent again, up to KEY_RETRIES times."""
    failed, retry = _delete_s3_request(client, bucket, batch)
    for attempt in range(KEY_RETRIES):
        if not retry:
            break
        time.sleep(random.uniform(0, KEY_RETRY_BASE_S * 2**attempt))
        more, retry = _delete_s3_request(client, bucket, retry)
        failed.extend(more)
    if retry:
        log.warning(
            "could not delete %d objects in s3://%s after %d attempts, e.g. %s",
            len(retry),
            bucket,
            KEY_RETRIES + 1,
            retry[0][1],
        )
    return failed + [path for _, path in retry]


def delete_files(io: FileIO, paths: list[str], workers: int = DELETE_THREADS) -> list[str]:
    """Delete ``paths``; returns those that could not be deleted (already gone counts as done)."""
    if not paths:
        return []
    s3_keys: dict[str, list[tuple[str, str]]] = defaultdict(list)
    others: list[str] = []
    client = None
    if any(urlsplit(p).scheme in S3_SCHEMES for p in paths):
        client = s3_client(io)
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


@dataclass(frozen=True)
class OpenUpload:
    """A multipart upload begun and never completed nor aborted: its parts cost storage, yet
    it is no object — no listing shows it, so no orphans run deletes it.

    pyarrow's S3 output streams leave one behind when an upload fails for good.
    """

    location: str
    upload_id: str
    initiated_ms: int


def list_open_uploads(io: FileIO, root: str) -> list[OpenUpload]:
    """The open multipart uploads under ``root`` (an ``s3://`` directory; [] elsewhere)."""
    parts = urlsplit(root)
    if parts.scheme not in S3_SCHEMES:
        return []
    client = s3_client(io)
    if client is None:
        return []
    prefix = parts.path.strip("/") + "/"
    found: list[OpenUpload] = []
    for page in client.get_paginator("list_multipart_uploads").paginate(
        Bucket=parts.netloc, Prefix=prefix
    ):
        for upload in page.get("Uploads", []):
            found.append(
                OpenUpload(
                    f"{parts.scheme}://{parts.netloc}/{upload['Key']}",
                    upload["UploadId"],
                    int(upload["Initiated"].timestamp() * 1000),
                )
            )
    return found


def abort_uploads(io: FileIO, uploads: list[OpenUpload]) -> list[OpenUpload]:
    """Abort ``uploads`` (their parts are deleted); returns those that could not be aborted."""
    if not uploads:
        return []
    client = s3_client(io)
    if client is None:
        return list(uploads)
    failed: list[OpenUpload] = []
    for upload in uploads:
        parts = urlsplit(upload.location)
        try:
            client.abort_multipart_upload(
                Bucket=parts.netloc, Key=parts.path.lstrip("/"), UploadId=upload.upload_id
            )
        except Exception as exc:  # report, keep going
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            if code == "NoSuchUpload":  # already completed or aborted
                continue
            log.warning("could not abort the upload of %s: %s", upload.location, exc)
            failed.append(upload)
    return failed
