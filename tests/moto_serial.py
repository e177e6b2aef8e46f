"""moto's S3 server with one request at a time inside moto (python tests/moto_serial.py HOST PORT).

moto checks If-None-Match and then stores the key in two steps, with no lock between them:
two threads of its server can both pass the check and both "create" a key, which is what an
unsafe endpoint does (`castore doctor s3://...` finds it: test_s3_doctor.py). The tests need a
faithful endpoint, so here moto's application runs under one lock; connections stay
concurrent (keep-alive, threads), only moto's work on a request is serialised.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


def serialised(app: Any) -> Callable[..., Iterable[bytes]]:
    lock = threading.Lock()

    def handle(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        with lock:
            # The body is built inside the lock too: moto may read the store while it streams.
            return list(app(environ, start_response))

    return handle


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, serialised(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
