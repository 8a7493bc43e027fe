"""The dashboard's optional bearer token: in an ``Authorization: Bearer`` header, or in a
cookie that opening any page with ``?token=`` once sets."""

from __future__ import annotations

import hmac
from email.message import Message
from http.cookies import CookieError, SimpleCookie

COOKIE = "compactor_token"


def presented_token(headers: Message) -> str | None:
    """The token a request carries, from its ``Authorization`` header or its cookie."""
    scheme, _, credentials = (headers.get("Authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    cookie = SimpleCookie()
    try:
        cookie.load(headers.get("Cookie") or "")
    except CookieError:
        return None
    morsel = cookie.get(COOKIE)
    return morsel.value if morsel else None


def token_matches(expected: str, presented: str | None) -> bool:
    """Whether ``presented`` is ``expected``, compared in constant time."""
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())


def token_cookie(token: str) -> str:
    """A ``Set-Cookie`` value holding ``token`` for this daemon's pages and API only."""
    cookie = SimpleCookie()
    cookie[COOKIE] = token
    morsel = cookie[COOKIE]
    morsel["path"] = "/"
    morsel["httponly"] = True
    morsel["samesite"] = "Strict"
    return morsel.OutputString()
