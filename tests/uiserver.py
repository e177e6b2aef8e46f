"""`castore ui` for the tests: the real command in a child process, on a free port (--port 0,
the URL read from the line it prints), stopped by its own pid when the test is done, and by
the kernel if this process dies first (PR_SET_PDEATHSIG), so none outlives its test run."""

from __future__ import annotations

import contextlib
import ctypes
import http.cookiejar
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

from helpers import read_line

PR_SET_PDEATHSIG = 1
_URL = re.compile(r"castore ui: (http://\S+?/)(?:\?token=(\S+))? ")


# Looked up before any fork: after one, in a process with threads, a lookup could wait on a
# loader lock another thread held.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class UiServer:
    """A running `castore ui`: its base URL, its token, and an HTTP client with cookies."""

    proc: subprocess.Popen[str]
    url: str
    token: str | None
    jar: http.cookiejar.CookieJar = field(default_factory=http.cookiejar.CookieJar)

    @property
    def origin(self) -> str:
        return self.url.rstrip("/")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        return self.request("GET", path, headers=headers)

    def post(
        self, path: str, form: dict[str, str], headers: dict[str, str] | None = None
    ) -> tuple[int, str]:
        data = urllib.parse.urlencode(form).encode()
        return self.request("POST", path, data, headers)

    def request(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1:PORT/ only
            self.url + path.lstrip("/"), data=data, method=method, headers=headers or {}
        )
        try:
            with opener.open(request, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def authed_cookie(self) -> bool:
        """Whether this client holds the token's cookie (set by opening the printed URL)."""
        return any(c.name.startswith("castore_ui_") and c.value == self.token for c in self.jar)

    def headers(self, path: str) -> dict[str, str]:
        """The headers of a GET of `path`, by their names in lower case."""
        request = urllib.request.Request(self.url + path.lstrip("/"))  # noqa: S310 - ours
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            return {name.lower(): value for name, value in answer.headers.items()}


@contextlib.contextmanager
def running(store: str, *flags: str, env: dict[str, str] | None = None) -> Iterator[UiServer]:
    """`castore ui --port 0 --store STORE FLAGS...`, until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "castore", "ui", "--port", "0", "--store", store, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - a prctl only, before exec
    )
    try:
        line = read_line(proc, timeout=30)
        match = _URL.match(line)
        if match is None:
            proc.kill()
            raise AssertionError(f"castore ui printed {line!r}; stderr: {proc.communicate()[1]}")
        yield UiServer(proc, match.group(1), match.group(2))
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.communicate(timeout=10)
