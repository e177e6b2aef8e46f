"""`castore ui` over HTTP, without a browser: the tasks page's counts and filters, a task's
page, the read-only default (the store's bytes unchanged by browsing), and the guard in front
of a resolve (token, Origin, Host), each refusal the CLI gives shown as the CLI gives it."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from helpers import cli, rewrite, tree_snapshot

import castore

pytest.importorskip("starlette", reason="castore ui needs the ui extra")
pytest.importorskip("uvicorn", reason="castore ui needs the ui extra")

from test_watch import make_unresolved
from uiserver import UiServer, running

PLAN = castore.Plan.build("pay", "price", castore.effect("charge", "price"), "email")


def fill(store: castore.Store) -> None:
    """order-1 done, order-2 running, order-3 UNRESOLVED, order-4 broken (HEAD cut short)."""
    with store.start("order-1", PLAN) as run:
        run.commit_step("price", 4200)
        run.perform("charge", castore.Service("payments"), lambda key: "ch_1")
        run.commit_step("email", "sent")
    with store.start("order-2", PLAN) as run:
        run.commit_step("price", 10)
    make_unresolved(store, "order-3")
    with store.start("order-4", PLAN) as run:
        run.commit_step("price", 7)
    head = store.status("order-4").head
    assert head is not None
    rewrite(Path(store.objects.path(head)), lambda data: data[: len(data) // 2])


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> castore.Store:
    store = castore.Store.init(tmp_path_factory.mktemp("ui") / "store")
    fill(store)
    return store


@pytest.fixture(scope="module")
def server(filled: castore.Store) -> UiServer:
    with running(filled.root) as ui:
        yield ui


def text_of(page: str) -> str:
    """The page's text, tags removed and entities decoded, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_the_tasks_page_counts_every_state(server: UiServer) -> None:
    """Counts at the top: 4 tasks, one in each of UNRESOLVED, broken, running and done."""
    code, page = server.get("/")
    assert 200 == code
    counts = dict(re.findall(r'id="count-(\w+)"><b>(\d+)</b>', page))
    assert {
        "all": "4",
        "unresolved": "1",
        "stuck": "0",
        "broken": "1",
        "running": "1",
        "done": "1",
    } == counts
    rows = re.findall(r'<tr data-state="(\w+)"><td><a class="mono" href="[^"]+">([^<]+)</a>', page)
    assert [
        ("done", "order-1"),
        ("running", "order-2"),
        ("unresolved", "order-3"),
        ("broken", "order-4"),
    ] == rows
    assert "3/3" in text_of(page)  # order-1: a fixed plan's steps done, of all


@pytest.mark.parametrize(
    ("state", "tasks"),
    [
        ("unresolved", ["order-3"]),
        ("broken", ["order-4"]),
        ("done", ["order-1"]),
        ("running", ["order-2"]),
        ("stuck", []),
    ],
)
def test_a_filter_shows_the_tasks_in_that_state(
    server: UiServer, state: str, tasks: list[str]
) -> None:
    """?state=S lists only the tasks in state S; the counts stay those of every task."""
    code, page = server.get(f"/?state={state}")
    assert 200 == code
    assert tasks == re.findall(r'<a class="mono" href="/task\?id=[^"]+">([^<]+)</a>', page)
    assert "<b>4</b> all" in page


def test_an_unknown_state_is_refused_with_the_states(server: UiServer) -> None:
    code, page = server.get("/?state=lost")
    assert 400 == code
    assert "no state 'lost': give one of unresolved, stuck, broken, running, done" in text_of(page)


def test_a_task_page_shows_its_unresolved_effect_and_the_commands(
    server: UiServer, filled: castore.Store
) -> None:
    """The effect's state and key, the timeline with its transitions, the plan, the brief,
    and the two `castore resolve` commands, naming the store; no form on a read-only page."""
    code, page = server.get("/task?id=order-3")
    assert 200 == code
    text = text_of(page)
    key = filled.status("order-3").effects[0].key
    assert key is not None
    assert f"charge UNRESOLVED {key}" in text
    assert "SUBMITTED -> UNRESOLVED" in text
    assert "PLANNED -> SUBMITTED" in text
    store = filled.root
    assert f"castore --store {store} resolve order-3 charge --confirmed RECEIPT" in text
    assert f"castore --store {store} resolve order-3 charge --not-done --reason TEXT" in text
    assert "price · done" in text
    assert filled.brief("order-3").text.strip().splitlines()[0] in html.unescape(page)
    assert "<form" not in page
    assert "castore ui --allow-resolve" in text


def test_a_broken_task_page_says_what_is_wrong(server: UiServer) -> None:
    code, page = server.get("/task?id=order-4")
    assert 200 == code
    assert "the chain does not verify" in text_of(page)


def test_a_task_that_is_not_there_is_a_404(server: UiServer) -> None:
    code, page = server.get("/task?id=order-9")
    assert 404 == code
    assert "order-9" in text_of(page)


def test_browsing_never_writes_to_the_store(server: UiServer, filled: castore.Store) -> None:
    """Every page, the alerts' feed and a refused resolve leave the store's bytes as they
    were (mode, size, mtime and content of every file)."""
    before = tree_snapshot(filled.root)
    for path in (
        "/",
        "/?state=unresolved",
        "/task?id=order-3",
        "/task?id=order-4",
        "/task?id=order-1&all=1",
        "/alerts",
        "/alerts.json",
    ):
        assert 200 == server.get(path)[0], path
    form = {"task": "order-3", "effect": "charge", "outcome": "confirmed", "receipt": "x"}
    code, page = server.post("/resolve", form)
    assert 403 == code
    assert "castore ui was started without --allow-resolve" in text_of(page)
    assert before == tree_snapshot(filled.root)


def test_a_request_naming_another_host_is_refused(server: UiServer) -> None:
    """DNS rebinding: a page of another site that names 127.0.0.1 gets nothing."""
    code, body = server.get("/", headers={"Host": "castore.example:80"})
    assert 421 == code
    assert "not 'castore.example:80'" in body


def test_every_page_forbids_framing_and_foreign_scripts(server: UiServer) -> None:
    """No framing (a resolve button under another site's page), no referrer elsewhere, and
    scripts only the page's own."""
    headers = server.headers("/")
    assert "DENY" == headers["x-frame-options"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "script-src 'nonce-" in headers["content-security-policy"]
    assert "same-origin" == headers["referrer-policy"]


# -- resolving ---------------------------------------------------------------------------------
@pytest.fixture
def resolvable(tmp_path: Path) -> UiServer:
    store = castore.Store.init(tmp_path / "store")
    make_unresolved(store, "order-3")
    with running(store.root, "--allow-resolve") as ui:
        assert ui.token is not None
        yield ui


def _form(ui: UiServer, **fields: str) -> dict[str, str]:
    return {"token": ui.token or "", "task": "order-3", "effect": "charge", **fields}


def test_resolve_without_the_token_is_refused_and_writes_nothing(resolvable: UiServer) -> None:
    store = castore.Store.open(resolvable.proc.args[-2])
    before = tree_snapshot(store.root)
    form = _form(resolvable, outcome="confirmed", receipt="ch_9")
    code, page = resolvable.post("/resolve", {**form, "token": ""})  # no cookie, no token
    assert 403 == code
    assert "not opened with the token castore ui printed" in text_of(page)
    assert 200 == resolvable.get(f"/?token={resolvable.token}")[0]  # sets the cookie
    code, page = resolvable.post("/resolve", {**form, "token": "wrong"})
    assert 403 == code
    code, page = resolvable.post("/resolve", form, headers={"Origin": "http://evil.example"})
    assert 403 == code
    assert "must come from this page, not from http://evil.example" in text_of(page)
    assert before == tree_snapshot(store.root)


def test_resolve_with_the_token_records_the_cli_resolve(
    resolvable: UiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the token (URL, then cookie and form): the CLI's `castore resolve`, its line, its
    audit record (who); a refusal is the CLI's own message, word for word."""
    root = resolvable.proc.args[-2]
    resolvable.get(f"/?token={resolvable.token}")
    refused = _form(resolvable, outcome="not-done", who="ana@ops")  # no reason
    code, page = resolvable.post("/resolve", refused, headers={"Origin": resolvable.origin})
    assert 409 == code
    cli_code, _, err = cli(
        capsys, "--store", root, "resolve", "order-3", "charge", "--not-done", "--who", "ana@ops"
    )
    assert 2 == cli_code
    assert err.strip() in text_of(page)
    assert "(exit status 2)" in text_of(page)
    form = _form(resolvable, outcome="confirmed", receipt="ch_9", who="ana@ops")
    code, page = resolvable.post("/resolve", form, headers={"Origin": resolvable.origin})
    assert 200 == code, text_of(page)
    assert "recorded: effect charge of task order-3 is CONFIRMED (receipt ch_9)" in text_of(page)
    _, out, _ = cli(capsys, "--store", root, "log", "order-3", "-n", "1")
    assert "resolve charge UNRESOLVED->CONFIRMED receipt=ch_9 by ana@ops" in out


def test_a_form_value_is_never_read_as_an_option(resolvable: UiServer) -> None:
    """A receipt that looks like a flag is the receipt, not --not-done."""
    resolvable.get(f"/?token={resolvable.token}")
    form = _form(resolvable, outcome="confirmed", receipt="--not-done", who="ana@ops")
    code, page = resolvable.post("/resolve", form, headers={"Origin": resolvable.origin})
    assert 200 == code, text_of(page)
    assert "CONFIRMED (receipt --not-done)" in text_of(page)
