"""Structured logs for the daemon: one JSON object a line, or ``key=value`` text on a terminal.

Log calls pass their fields as ``extra``: ``log.info("run finished", extra={"event":
"run_finished", "table": "db.t"})``; both formats print every field.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from compactor.redaction import protect

# Attributes every LogRecord has: the rest came in through ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of ``record``."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _exception(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    """The record's traceback: already formatted (and redacted) when a filter did so."""
    if record.exc_text:
        return record.exc_text
    return formatter.formatException(record.exc_info) if record.exc_info else None


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "message": ..., **fields}``."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **fields(record),
        }
        trace = _exception(self, record)
        if trace:
            document["exception"] = trace
        return json.dumps(document, default=str)


class TextFormatter(logging.Formatter):
    """``2026-11-22T10:00:00.000Z info run finished table=db.t outcome=succeeded``."""

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in fields(record).items())
        line = f"{_timestamp(record)} {record.levelname.lower()} {record.getMessage()} {extra}"
        trace = _exception(self, record)
        if trace:
            line += "\n" + trace
        return line.rstrip()


def configure_logging(log_format: str, verbose: bool = False) -> None:
    """Send logs to stderr as JSON (``json``, or ``auto`` off a terminal) or as text."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = protect(logging.StreamHandler(sys.stderr))
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # Libraries speak up only when something is wrong.
    for noisy in ("apscheduler", "pyiceberg", "botocore", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
