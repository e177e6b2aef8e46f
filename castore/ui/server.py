"""Serving the page: the listening socket, its URL, and uvicorn (the only importer of uvicorn).

The socket is bound before the server starts, so that port 0 (any free port) gives a URL
to print before the first request, and a port in use is refused with one line.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn

from castore.errors import UsageError
from castore.ui import guard
from castore.ui.app import Resolver, Settings, make_app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port` (0: a free port); UsageError if it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); give another --port "
            "(0: any free port)"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def serve(
    sock: socket.socket,
    host: str,
    *,
    store_path: str,
    store_arg: str | None,
    token: str,
    resolver: Resolver | None,
    who: str,
    stuck_after: float,
    started: Callable[[], None] = lambda: None,
) -> None:
    """Serve the page on `sock` until SIGINT or SIGTERM; `started` runs once the
    application is made (the store opened), before the first request is taken."""
    port = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    settings = Settings(
        store_path=store_path,
        store_arg=store_arg,
        guard=guard.Guard(shown, port, token),
        resolver=resolver,
        who=who,
        stuck_after=stuck_after,
    )
    app, stop = make_app(settings)
    started()
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        stop()
        sock.close()
