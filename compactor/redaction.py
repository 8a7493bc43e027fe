"""Keep credentials out of every line compactor prints or logs, libraries' debug logs included.

Secrets are known two ways: values of catalog and storage properties whose names say they are
secret (``s3.secret-access-key``, ``s3.access-key-id``, ``token``, ``credential``, ...) and of
the AWS credential environment variables, registered as catalogs are opened; and shapes that are
secret wherever they appear (AWS access key ids, the ``Credential=`` and ``Signature=`` parts of
a SigV4 ``Authorization`` header, security tokens). :class:`RedactingFilter` rewrites log records
before any handler formats them; :func:`redact` does the same for any text.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

MASK = "***"
# Property names (any case, any separator) whose values are credentials.
SECRET_NAME = re.compile(
    r"secret|password|passwd|token|credential|access[-_.]?key|session|private[-_.]?key",
    re.IGNORECASE,
)
SECRET_ENVIRONMENT = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "RAY_AUTH_TOKEN",  # a Ray cluster's token: whoever has it runs code on the cluster
)
SECRET_SHAPES = (
    # AWS access key ids (long-term AKIA, temporary ASIA, ...).
    (re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|ANPA)[A-Z0-9]{12,}\b"), MASK),
    # SigV4 Authorization header and presigned URLs.
    (re.compile(r"(Credential=)[^/,\s&'\"]+"), r"\1" + MASK),
    (re.compile(r"(X-Amz-Credential=)[^/,\s&'\"%]+"), r"\1" + MASK),
    (re.compile(r"(Signature=)[0-9a-fA-F]+"), r"\1" + MASK),
    (
        re.compile(
            r"((?:X-Amz-Security-Token|x-amz-security-token)['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s,&}]+"
        ),
        r"\1" + MASK,
    ),
)
MIN_SECRET_LENGTH = 4

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def register_secrets(properties: Mapping[str, Any]) -> None:
    """Remember the values of ``properties`` whose names say they are credentials, and the
    passwords of URIs among the others."""
    values = set()
    for name, value in properties.items():
        if value is None:
            continue
        if SECRET_NAME.search(str(name)):
            values.add(str(value))
        elif "://" in str(value):  # a password in a URI: postgresql://user:password@host/db
            password = urlsplit(str(value)).password
            if password:
                values.add(password)
    _add(values)


def register_environment() -> None:
    """Remember the credentials in this process's environment (AWS, Ray)."""
    _add({os.environ[name] for name in SECRET_ENVIRONMENT if os.environ.get(name)})


def _add(values: set[str]) -> None:
    global _pattern
    values = {v for v in values if len(v) >= MIN_SECRET_LENGTH}
    with _lock:
        if values <= _secrets:
            return
        _secrets.update(values)
        # Longest first, so a secret containing another is masked whole.
        ordered = sorted(_secrets, key=len, reverse=True)
        _pattern = re.compile("|".join(map(re.escape, ordered)))


def redact(text: str) -> str:
    """``text`` with every known secret and secret-shaped token replaced by ``***``."""
    pattern = _pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for shape, replacement in SECRET_SHAPES:
        text = shape.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Masks secrets in a record's message, its arguments, extra fields and exception text."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = redact(message), None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
            record.exc_info = None
        for key, value in list(vars(record).items()):
            if isinstance(value, str) and key not in {"msg", "name", "levelname", "pathname"}:
                setattr(record, key, redact(value))
        return True


def protect(handler: logging.Handler) -> logging.Handler:
    """``handler`` with secrets masked in everything it writes."""
    register_environment()
    if not any(isinstance(f, RedactingFilter) for f in handler.filters):
        handler.addFilter(RedactingFilter())
    return handler
