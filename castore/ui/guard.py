"""Who may use the page, and who may resolve from it: the Host a request names, the Origin
a form came from, and the token printed at start (pure; no web framework).

Every request must name this server by the Host it listens on: a page on another site that
points a name of its own at 127.0.0.1 (DNS rebinding) is refused before anything is read. A
resolve must also come from this server's own pages (Origin, when the browser sends one),
carry the token in its form, and the same token in the cookie that opening the printed URL
sets (SameSite=Strict, HttpOnly): a form on another site can have neither.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

from castore.format.model import attrs

COOKIE = "castore_ui_token"
FIELD = "token"


def new_token() -> str:
    """A fresh secret for one run of the server (as Jupyter prints one)."""
    return secrets.token_urlsafe(24)


def same(given: str | None, token: str) -> bool:
    """`given` is the token (compared in constant time)."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


@attrs.frozen
class Guard:
    """The checks of one server: its host and port, and its token."""

    host: str
    port: int
    token: str

    @property
    def hosts(self) -> frozenset[str]:
        """The Host headers that name this server."""
        names = {self.host, "localhost"} if _loopback(self.host) else {self.host}
        if _loopback(self.host):
            names |= {"127.0.0.1", "[::1]"}
        return frozenset(f"{name}:{self.port}" for name in names)

    def host_problem(self, host: str | None) -> str | None:
        """Why a request naming `host` is refused, or None."""
        if host is not None and host.lower() in self.hosts:
            return None
        return (
            f"this server answers to {', '.join(sorted(self.hosts))}, not {host!r}; "
            "open the URL castore ui printed"
        )

    def resolve_problem(
        self, headers: Mapping[str, str], form_token: str | None, cookie_token: str | None
    ) -> str | None:
        """Why a resolve is refused (a request from another site, no token), or None."""
        origin = headers.get("origin")
        if origin is not None and origin != "null":
            parts = urlsplit(origin)
            if parts.scheme != "http" or parts.netloc.lower() not in self.hosts:
                return f"a resolve must come from this page, not from {origin}"
        elif origin == "null":
            return "a resolve must come from this page, not from a page without an origin"
        if not same(form_token, self.token) or not same(cookie_token, self.token):
            return (
                "this page was not opened with the token castore ui printed at start: open "
                "the URL with ?token=... it printed, then resolve again"
            )
        return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
