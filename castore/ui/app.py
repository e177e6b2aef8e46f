"""The web application: routes, the token's cookie and the security headers (the only
importer of Starlette). GET never writes to the store; POST /resolve runs the resolver the
server was given, and only when resolution was allowed and the guard lets it through."""

from __future__ import annotations

import html
import secrets
import shlex
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from castore.errors import CastoreError, TaskNotFoundError, UsageError
from castore.format.model import attrs
from castore.store import Store
from castore.ui import guard, pages, taskview
from castore.ui.board import Board, watch_argv
from castore.ui.reading import STATES, TaskReader, counts, state_of

# A resolve: the words after `castore --store S resolve`, and the CLI's exit status and the
# lines it printed (its refusal, word for word, or its "recorded: ..." line).
Resolver = Callable[[list[str]], tuple[int, str]]

LABELS = {
    "unresolved": "UNRESOLVED",
    "stuck": "stuck",
    "broken": "broken",
    "running": "running",
    "done": "done",
}
MAX_FORM_BYTES = 64 * 1024
R = TypeVar("R", bound=Response)
POLL_MS = 1000  # how often the alerts page asks for changes


@attrs.frozen
class Settings:
    """What one server shows and allows."""

    store_path: str
    store_arg: str | None  # the --store that the shown commands name (None: the default)
    guard: guard.Guard
    resolver: Resolver | None  # None: read-only (no --allow-resolve)
    who: str  # the form's default `who`
    stuck_after: float
    poll_ms: int = POLL_MS


class _Pages:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = Store.open(settings.store_path)
        self.board = Board(watch_argv(settings.store_path, settings.stuck_after))
        self.cookie = f"castore_ui_{settings.guard.port}"  # a cookie is per host, not port

    # -- the token -----------------------------------------------------------------------
    def authed(self, request: Request) -> bool:
        return guard.same(request.cookies.get(self.cookie), self.settings.guard.token)

    def _redirect(self, request: Request) -> RedirectResponse | None:
        """For a URL holding the token: a redirect to it without the token that sets the
        token's cookie (so the token leaves the address bar and the history)."""
        given = request.query_params.get(guard.FIELD)
        token = self.settings.guard.token
        if given is None or not guard.same(given, token):
            return None
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != guard.FIELD]
        target = request.url.path + (f"?{urlencode(kept)}" if kept else "")
        redirect = RedirectResponse(target, status_code=303)
        redirect.set_cookie(self.cookie, token, httponly=True, samesite="strict", path="/")
        return _secured(redirect)

    def _context(self, request: Request, **context: Any) -> dict[str, Any]:
        """What every page's template is given, `context` included."""
        note = None
        if request.query_params.get(guard.FIELD) is not None:
            note = "the token in this URL is not this server's: open the URL castore ui printed"
        authed = self.authed(request)
        return {
            "store_root": self.store.root,
            "resolvable": self.settings.resolver is not None,
            "authed": authed,
            "form_token": self.settings.guard.token if authed else "",
            "token_note": note,
            "label": LABELS,
            "nonce": secrets.token_urlsafe(12),
            **context,
        }

    def _page(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse | RedirectResponse:
        """The page (or the token's redirect)."""
        redirect = self._redirect(request)
        if redirect is not None:
            return redirect
        filled = self._context(request, **context)
        page = pages.render(template, **filled)
        return _secured(HTMLResponse(page, status_code=status), filled["nonce"])

    # -- the pages -------------------------------------------------------------------------
    def tasks(self, request: Request) -> Response:
        """Streamed: the page's head goes out at once, then the tasks as soon as they are
        read (5,000 HEADs take about half a second), then its end."""
        wanted = request.query_params.get("state")
        if wanted is not None and wanted not in STATES:
            message = f"no state {wanted!r}: give one of {', '.join(STATES)}"
            return self._page(
                request, "missing.html", 400, title="Tasks", page="tasks", message=message
            )
        redirect = self._redirect(request)
        if redirect is not None:
            return redirect
        filled = self._context(request, title="Tasks", page="tasks")

        def chunks() -> Iterator[str]:
            yield pages.render("_top.html", **filled)
            yield self._tasks_table(filled, wanted)
            yield pages.render("_bottom.html", **filled)

        response = StreamingResponse(chunks(), media_type="text/html")
        return _secured(response, filled["nonce"])

    def _tasks_table(self, filled: dict[str, Any], wanted: str | None) -> str:
        start = time.perf_counter()
        try:
            rows = TaskReader(self.store, self.settings.stuck_after).rows()
        except CastoreError as exc:  # the store itself, unreadable now (I/O, the network)
            return f'<div class="error" id="problem">{html.escape(str(exc))}</div>'
        shown = rows if wanted is None else [row for row in rows if row.state == wanted]
        return pages.render(
            "_tasks.html",
            **filled,
            rows=shown,
            counts=counts(rows),
            states=STATES,
            state=wanted,
            now=time.time(),
            elapsed=time.perf_counter() - start,
            stuck_after=self.settings.stuck_after,
        )

    def task(self, request: Request) -> HTMLResponse | RedirectResponse:
        task = request.query_params.get("id", "")
        try:
            status = self.store.status(task)
        except (TaskNotFoundError, UsageError) as exc:  # no such task, or no such task id
            return self._page(
                request, "missing.html", 404, title="No such task", page="tasks", message=str(exc)
            )
        except CastoreError as exc:  # the store, unreadable now (I/O, the network)
            return self._page(
                request, "missing.html", 503, title="Unreadable", page="tasks", message=str(exc)
            )
        view = taskview.read_task(
            self.store,
            task,
            status,
            store_arg=self.settings.store_arg,
            everything=request.query_params.get("all") == "1",
        )
        return self._page(
            request,
            "task.html",
            title=task,
            page="tasks",
            view=view,
            state=state_of(status, self.settings.stuck_after),
            who=self.settings.who,
        )

    def alerts(self, request: Request) -> HTMLResponse | RedirectResponse:
        self.board.ensure_started()
        return self._page(
            request,
            "alerts.html",
            title="Alerts",
            page="alerts",
            board=self.board.snapshot(),
            poll_ms=self.settings.poll_ms,
        )

    def alerts_json(self, request: Request) -> JSONResponse:
        self.board.ensure_started()
        return _secured(JSONResponse(self.board.snapshot()))

    async def resolve(self, request: Request) -> HTMLResponse | RedirectResponse:
        resolver = self.settings.resolver
        if resolver is None:
            return self._outcome(
                request,
                403,
                (
                    "castore: error: resolving from this page is off: castore ui was started "
                    "without --allow-resolve; run the command the task's page shows"
                ),
            )
        body = await _body(request)
        if body is None:
            return self._outcome(request, 413, "castore: error: the form is too large")
        form = {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}
        problem = self.settings.guard.resolve_problem(
            request.headers, form.get(guard.FIELD), request.cookies.get(self.cookie)
        )
        if problem is not None:
            return self._outcome(request, 403, f"castore: error: {problem}", form.get("task"))
        argv = resolve_words(form)
        if argv is None:
            return self._outcome(
                request,
                400,
                "castore: error: the form names no task and effect, or no outcome",
                form.get("task"),
            )
        code, message = await run_in_threadpool(resolver, argv)
        words = (
            ["castore"]
            + (["--store", self.settings.store_arg] if self.settings.store_arg else [])
            + ["resolve", *argv]
        )
        return self._outcome(
            request,
            200 if code == 0 else 409,
            message,
            form.get("task"),
            code=code,
            command=shlex.join(words),
        )

    def _outcome(
        self,
        request: Request,
        status: int,
        message: str,
        task: str | None = None,
        *,
        code: int | None = None,
        command: str | None = None,
    ) -> HTMLResponse | RedirectResponse:
        return self._page(
            request,
            "outcome.html",
            status,
            title="Resolve",
            page="tasks",
            message=message.strip(),
            task=task,
            code=1 if code is None else code,
            command=command,
        )


def resolve_words(form: dict[str, str]) -> list[str] | None:
    """`castore resolve`'s words for a submitted form, values given as `--opt=VALUE` and the
    ids after `--`, so that no text a person typed (or a task id) is read as an option."""
    task, effect, outcome = form.get("task"), form.get("effect"), form.get("outcome")
    if not task or not effect or outcome not in ("confirmed", "not-done"):
        return None
    if outcome == "confirmed":
        words = [f"--confirmed={form.get('receipt', '')}"]
    else:
        words = ["--not-done"]
        if form.get("reason", "").strip():
            words.append(f"--reason={form['reason']}")
        if form.get("submitter_ended"):
            words.append("--submitter-ended")
    if form.get("who", "").strip():
        words.append(f"--who={form['who']}")
    return [*words, "--", task, effect]


async def _body(request: Request) -> str | None:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _secured(response: R, nonce: str | None = None) -> R:
    """No framing (a resolve button under another site's page), no referrer to another site
    (a URL may hold the token; "no-referrer" would make the browser send `Origin: null` with
    this page's own forms), no cache, and scripts only this page's own (its nonce)."""
    script = f"'nonce-{nonce}'" if nonce else "'none'"
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; style-src 'unsafe-inline'; script-src {script}; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


class _HostCheck:
    """Refuse any request whose Host does not name this server (DNS rebinding)."""

    def __init__(self, app: ASGIApp, checks: guard.Guard) -> None:
        self.app = app
        self.checks = checks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host")
            problem = self.checks.host_problem(host.decode("latin-1") if host else None)
            if problem is not None:
                response = PlainTextResponse(f"castore ui: {problem}\n", status_code=421)
                await _secured(response)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def make_app(settings: Settings) -> tuple[ASGIApp, Callable[[], None]]:
    """The application, and what stops it (its alerts' watcher)."""
    handlers = _Pages(settings)
    app = Starlette(
        routes=[
            Route("/", handlers.tasks),
            Route("/task", handlers.task),
            Route("/alerts", handlers.alerts),
            Route("/alerts.json", handlers.alerts_json),
            Route("/resolve", handlers.resolve, methods=["POST"]),
        ]
    )
    return _HostCheck(app, settings.guard), handlers.board.stop
