"""`castore ui` over HTTP, without a browser: the tasks page's counts and filters, a task's
page, the read-only default (the store's bytes unchanged by browsing), and the guard in front
of a resolve (token, Origin, Host), each refusal the CLI gives shown as the CLI gives it."""

from __future__ import annotations

import html
import json
import re
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, read_line, rewrite, tree_snapshot, wait_for
from s3servers import S3Endpoint

import castore

pytest.importorskip("starlette", reason="castore ui needs the ui extra")
pytest.importorskip("uvicorn", reason="castore ui needs the ui extra")

from test_watch import make_unresolved, write
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


def test_an_effect_submitted_too_long_is_stuck(tmp_path: Path) -> None:
    """SUBMITTED for longer than --stuck-after: the task is stuck, as castore watch says."""
    store = castore.Store.init(tmp_path / "store")
    write(store, "order-8", "submit")  # the request went out, the connection dropped
    with running(store.root, "--stuck-after", "0.001") as ui:
        code, page = ui.get("/?state=stuck")
    assert 200 == code
    assert ["order-8"] == re.findall(r'<a class="mono" href="/task\?id=[^"]+">([^<]+)</a>', page)
    assert "charge SUBMITTED" in text_of(page)


def test_a_hostile_task_id_is_text_on_every_page(tmp_path: Path) -> None:
    """A task id (a key, a reason: text a caller chose) never becomes markup."""
    store = castore.Store.init(tmp_path / "store")
    hostile = '<img src=x onerror=alert(1)>&"q"'
    with store.start(hostile, PLAN) as run:
        run.commit_step("price", "<script>alert(2)</script>")
    with running(store.root) as ui:
        pages = [ui.get("/")[1], ui.get("/task?id=" + urllib.parse.quote(hostile))[1]]
    for page in pages:
        assert "<img src=x" not in page
        assert "<script>alert" not in page
        assert hostile in text_of(page)


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


# -- an S3 store -------------------------------------------------------------------------------
def _bucket_state(s3: S3Endpoint, url: str) -> dict[str, tuple[str, int]]:
    """Every object of the store's bucket: its ETag and size."""
    import boto3  # noqa: PLC0415 - the s3 extra

    bucket = url.removeprefix("s3://").partition("/")[0]
    listed = boto3.client("s3", **s3.options()).list_objects_v2(Bucket=bucket)
    return {o["Key"]: (o["ETag"], o["Size"]) for o in listed.get("Contents", [])}


@pytest.mark.s3
@pytest.mark.parametrize("s3_endpoint", ["moto"], indirect=True)
def test_the_pages_work_on_an_s3_store(s3: S3Endpoint) -> None:
    """On moto: the tasks page counts and lists the tasks, a task's page shows its effect and
    timeline, the alerts page watches by listing, and browsing writes no object."""
    url = s3.new_bucket("ui")
    store = castore.Store.init(url)
    with store.start("order-1", PLAN, lock_timeout=None) as run:
        run.commit_step("price", 4200)
        run.perform("charge", castore.Service("payments"), lambda key: "ch_1")
        run.commit_step("email", "sent")
    with store.start("order-2", PLAN, lock_timeout=None) as run:
        run.commit_step("price", 10)  # charge, an effect, is next: PLANNED, its key durable
    before = _bucket_state(s3, url)
    with running(url) as ui:
        code, page = ui.get("/")
        assert 200 == code
        counts = dict(re.findall(r'id="count-(\w+)"><b>(\d+)</b>', page))
        assert ("2", "1", "1") == (counts["all"], counts["done"], counts["running"])
        assert ["order-1", "order-2"] == re.findall(r'href="/task\?id=[^"]+">([^<]+)</a>', page)
        code, page = ui.get("/task?id=order-2")
        assert 200 == code
        assert "charge PLANNED" in text_of(page)
        code, page = ui.get("/task?id=order-1")
        assert "PLANNED -> SUBMITTED" in text_of(page)
        assert "SUBMITTED -> CONFIRMED" in text_of(page)
        assert "ch_1" in text_of(page)
        assert 200 == ui.get("/alerts")[0]
        assert "listing every" in str(wait_for(lambda: _watching(ui), what="the first scan"))
    assert before == _bucket_state(s3, url)


def _watching(ui: UiServer) -> str | None:
    code, body = ui.get("/alerts.json")
    board = json.loads(body)
    return str(board["mode"]) if 200 == code and board["state"] == "watching" else None


def test_the_cli_parser_does_not_load_the_ui() -> None:
    """`castore --help` loads none of castore.ui, Starlette, uvicorn or Jinja2."""
    probe = "from castore.cli import build_parser\nbuild_parser().format_help()\nimport sys\n"
    probe += "print('\\n'.join(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "castore.cli.ui" in loaded
    assert [] == [m for m in loaded if m.split(".")[0] in ("starlette", "uvicorn", "jinja2")]
    assert [] == [m for m in loaded if m.startswith("castore.ui")]


# -- a LangGraph thread ------------------------------------------------------------------------
def _langgraph_thread(root: str) -> list[str]:
    """A two-node graph (fetch, then summarize) run once on thread chat-7 with CastoreSaver;
    the ids of the checkpoints it saved, newest first."""
    pytest.importorskip("langgraph", reason="the langgraph extra")
    import operator  # noqa: PLC0415
    from typing import Annotated, TypedDict  # noqa: PLC0415

    from castore.langgraph import CastoreSaver  # noqa: PLC0415
    from castore.langgraph.deps import END, START, StateGraph  # noqa: PLC0415

    # Spelled as a call: a class body's annotations would be strings, resolved at module level.
    State = TypedDict("State", {"items": Annotated[list[str], operator.add]})  # noqa: UP013

    graph = StateGraph(State)
    graph.add_node("fetch", lambda state: {"items": ["a"]})
    graph.add_node("summarize", lambda state: {"items": ["b"]})
    graph.add_edge(START, "fetch")
    graph.add_edge("fetch", "summarize")
    graph.add_edge("summarize", END)
    config: Any = {"configurable": {"thread_id": "chat-7"}}
    with CastoreSaver(castore.Store.open(root)) as saver:
        graph.compile(checkpointer=saver).invoke({"items": []}, config)
        return [c.config["configurable"]["checkpoint_id"] for c in saver.list(config)]


def test_a_langgraph_thread_shows_its_checkpoints_and_nodes(tmp_path: Path) -> None:
    """CastoreSaver's task: every checkpoint id, the nodes that wrote it and run next (as
    `castore log --thread` reads them), each timeline entry in LangGraph's words."""
    store = castore.Store.init(tmp_path / "store")
    checkpoints = _langgraph_thread(store.root)
    [task] = store.tasks()
    with running(store.root) as ui:
        code, page = ui.get(f"/task?id={task}")
    assert 200 == code
    text = text_of(page)
    assert "The thread 'chat-7', namespace '': 4 checkpoints" in text
    for checkpoint in checkpoints:
        assert checkpoint in text
    rows = re.findall(r"<tr><td>(\d+)</td><td class=\"mono\">([^<]+)</td>(.*?)</tr>", page)
    by_id = {checkpoint: text_of(rest) for _, checkpoint, rest in rows}
    # Step 1: fetch wrote it, summarize runs next (as `castore log --thread` says).
    assert "1 (loop) fetch items summarize" == by_id[checkpoints[1]]
    assert "writes of summarize for checkpoint" in text


# -- the command line --------------------------------------------------------------------------
def test_ui_on_a_path_that_is_no_store_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The usual one line and exit 2, before anything listens."""
    code, out, err = cli(capsys, "ui", "--store", str(tmp_path / "nowhere"), "--port", "0")
    assert (2, "") == (code, out)
    assert err.startswith("castore: error: ")
    assert 1 == len(err.strip().splitlines())


def test_ui_on_a_port_in_use_says_so(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        code, _, err = cli(capsys, "ui", "--store", store.root, "--port", port)
    assert 2 == code
    assert f"castore: error: cannot listen on 127.0.0.1:{port}" in err
    assert "give another --port (0: any free port)" in err


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])  # noqa: S104 - refused, never bound
def test_ui_refuses_to_listen_on_every_address(
    store: castore.Store, capsys: pytest.CaptureFixture[str], host: str
) -> None:
    """Every request must name the address: "all of them" is not one a browser can name."""
    code, _, err = cli(capsys, "ui", "--store", store.root, "--port", "0", "--host", host)
    assert 2 == code
    assert f"--host {host}: give the one address people will open" in err


def test_ui_json_prints_where_it_listens(store: castore.Store) -> None:
    """`ui --json`: one line, {"type": "ui", url, open, store, resolve}, then it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "castore", "ui", "--store", store.root, "--port", "0",
         "--allow-resolve", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = json.loads(read_line(proc, timeout=30))
        assert ("ui", store.root, True) == (line["type"], line["store"], line["resolve"])
        assert line["open"].startswith(line["url"] + "?token=")
        server = UiServer(proc, line["url"], line["open"].partition("=")[2])
        assert 200 == server.get(line["open"].removeprefix(line["url"]))[0]
        assert server.authed_cookie()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


# -- the guard, alone --------------------------------------------------------------------------
def test_the_guard_knows_this_servers_names_only() -> None:
    """On a loopback address the page answers to its address, localhost and ::1 at its port."""
    from castore.ui.guard import Guard  # noqa: PLC0415 - after the ui extra's skip

    checks = Guard("127.0.0.1", 8470, "t0ken")
    for host in ("127.0.0.1:8470", "localhost:8470", "LOCALHOST:8470", "[::1]:8470"):
        assert checks.host_problem(host) is None, host
    for host in (None, "127.0.0.1", "127.0.0.1:8471", "evil.example:8470", "127.0.0.2:8470"):
        assert checks.host_problem(host) is not None, host
    assert {"ops.internal:9000"} == set(Guard("ops.internal", 9000, "t").hosts)


@pytest.mark.parametrize(
    ("origin", "form", "cookie", "refused"),
    [
        ("http://127.0.0.1:8470", "t0ken", "t0ken", None),
        (None, "t0ken", "t0ken", None),  # a client that sends no Origin: the tokens decide
        ("http://localhost:8470", "t0ken", "t0ken", None),
        ("https://127.0.0.1:8470", "t0ken", "t0ken", "must come from this page"),
        ("http://evil.example", "t0ken", "t0ken", "must come from this page"),
        ("null", "t0ken", "t0ken", "without an origin"),
        ("http://127.0.0.1:8470", "", "t0ken", "not opened with the token"),
        ("http://127.0.0.1:8470", "t0ken", None, "not opened with the token"),
        ("http://127.0.0.1:8470", "t0ken", "other", "not opened with the token"),
    ],
)
def test_a_resolve_needs_this_origin_and_the_token_twice(
    origin: str | None, form: str, cookie: str | None, refused: str | None
) -> None:
    from castore.ui.guard import Guard  # noqa: PLC0415

    headers = {} if origin is None else {"origin": origin}
    problem = Guard("127.0.0.1", 8470, "t0ken").resolve_problem(headers, form, cookie)
    assert (refused is None) == (problem is None), problem
    assert refused is None or refused in str(problem)
