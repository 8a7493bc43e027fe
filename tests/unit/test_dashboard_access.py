"""The dashboard's token: where a request may carry it, and the cookie that keeps it."""

from __future__ import annotations

from email.message import Message
from http.cookies import SimpleCookie
from pathlib import Path

import pytest

from compactor.daemon.config import HTTP_TOKEN_ENVIRONMENT, load_daemon_config
from compactor.daemon.dashboard.access import COOKIE, presented_token, token_cookie, token_matches
from compactor.redaction import MASK, redact


def _headers(**values: str) -> Message:
    headers = Message()
    for name, value in values.items():
        headers[name.replace("_", "-")] = value
    return headers


def test_a_bearer_header_or_the_cookie_carries_the_token() -> None:
    assert presented_token(_headers(Authorization="Bearer s3cret")) == "s3cret"
    assert presented_token(_headers(Authorization="bearer  s3cret ")) == "s3cret"
    assert presented_token(_headers(Cookie=f"theme=dark; {COOKIE}=s3cret")) == "s3cret"
    assert presented_token(_headers(Authorization="Basic dXNlcjpwYXNz")) is None
    assert presented_token(_headers(Cookie="theme=dark")) is None
    assert presented_token(_headers()) is None


def test_only_the_same_token_matches() -> None:
    assert token_matches("s3cret", "s3cret")
    assert not token_matches("s3cret", "s3cre")
    assert not token_matches("s3cret", "")
    assert not token_matches("s3cret", None)


def test_the_cookie_is_for_this_site_and_not_for_scripts() -> None:
    text = token_cookie("s3cret")
    morsel = SimpleCookie(text)[COOKIE]
    assert (morsel.value, morsel["path"], morsel["samesite"]) == ("s3cret", "/", "Strict")
    assert "HttpOnly" in text
    assert presented_token(_headers(Cookie=f"{COOKIE}={morsel.coded_value}")) == "s3cret"


def test_the_environments_token_wins_over_the_files_and_is_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(HTTP_TOKEN_ENVIRONMENT, raising=False)
    config = tmp_path / "compactor.toml"
    config.write_text("[daemon]\n")
    assert load_daemon_config(config).http_token is None
    config.write_text('[daemon]\nhttp_token = "token-from-the-file"\n')
    assert load_daemon_config(config).http_token == "token-from-the-file"
    monkeypatch.setenv(HTTP_TOKEN_ENVIRONMENT, "token-from-the-environment")
    assert load_daemon_config(config).http_token == "token-from-the-environment"
    assert redact("sent token-from-the-environment") == f"sent {MASK}"
