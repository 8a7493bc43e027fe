"""Credentials masked in every line compactor prints or logs: secret shapes, registered values
and log records (their message, arguments, extra fields and tracebacks)."""

from __future__ import annotations

import logging
import sys

from compactor.daemon.logs import JsonFormatter
from compactor.redaction import MASK, RedactingFilter, redact, register_secrets

ACCESS_KEY_ID = "AKIACOMPACTORTEST7Q2Z"
SECRET = "cmp/Secret+Key-9f8e7d6c5b4a3f2e1d0c"
PASSWORD = "pg-pass-4c1d"


def test_secret_shapes_and_registered_values_are_masked() -> None:
    register_secrets({"s3.secret-access-key": SECRET, "uri": f"postgresql://u:{PASSWORD}@h/db"})
    line = (
        "headers={'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAOTHERKEY00000000/20261123/"
        "us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0a1b2c3d4e5f', "
        f"'X-Amz-Security-Token': b'FwoGZX'}} secret={SECRET} password {PASSWORD} key "
        f"{ACCESS_KEY_ID}"
    )
    masked = redact(line)
    for leaked in (SECRET, PASSWORD, ACCESS_KEY_ID, "AKIAOTHERKEY", "0a1b2c3d4e5f", "FwoGZX"):
        assert leaked not in masked
    assert masked.count(MASK) == 6


def test_log_records_are_masked_in_message_arguments_fields_and_tracebacks() -> None:
    register_secrets({"s3.secret-access-key": SECRET})
    record = logging.LogRecord("botocore", logging.DEBUG, __file__, 1, "sent %s", (SECRET,), None)
    record.detail = f"key={SECRET}"
    try:
        raise RuntimeError(f"refused with {SECRET}")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    text = JsonFormatter().format(record)
    assert SECRET not in text
    assert "sent ***" in text and "key=***" in text and "refused with ***" in text
