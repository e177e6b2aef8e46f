"""The README's and the documentation site's examples run as written, and the README's two
commands are the ones CI and users run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import castore

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Every page whose ```python blocks run: the README, then each page of the site in path order.
# (FORMAT.md's blocks are byte layouts, JavaScript and plain text, none marked python.)
PAGES = [README, *sorted(DOCS.rglob("*.md"))]


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def _collect() -> dict[str, str]:
    """Each distinct block, named by its first page and its number there (a block the
    README and a page share, the README's example, is one block, run once)."""
    blocks: dict[str, str] = {}
    for page in PAGES:
        for number, block in enumerate(_python_blocks(page), 1):
            if block not in blocks.values():
                blocks[f"{page.relative_to(ROOT)}#{number}"] = block
    return blocks


NAMED = _collect()
BLOCKS = list(NAMED.values())


def _page(name: str) -> Path:
    """The page of the site that holds a text a test below checks (it moved out of the README)."""
    return DOCS / name


def test_readme_has_runnable_examples() -> None:
    """The README's library example is runnable Python, and so are the site's tutorial
    examples (a first task, a side effect, two agent loops, LangGraph's two)."""
    assert 1 <= len(_python_blocks(README))
    tutorial = [name for name in NAMED if name.startswith("docs/tutorial/")]
    assert len(tutorial) >= 6, tutorial


# The languages a fenced block may be marked with: `python` runs in the tests below; `py` is a
# fragment that needs names defined around it (a client, a pager) and is only read.
FENCES = {"python", "py", "sh", "text", "json", "js", ""}


def test_every_fenced_block_is_marked_with_a_known_language() -> None:
    """No page hides Python from these tests behind another tag (```python3, ```pycon):
    every fenced block is marked with a language listed in FENCES."""
    unknown = [
        (str(page.relative_to(ROOT)), tag)
        for page in PAGES
        for tag in re.findall(r"^ *```([^`\s]*)\n", page.read_text(encoding="utf-8"), re.M)
        if tag not in FENCES
    ]
    assert [] == unknown


@pytest.mark.parametrize("name", list(NAMED))
def test_readme_example_runs_twice_in_a_fresh_directory(name: str, tmp_path: Path) -> None:
    """Each example runs as written (twice: the second run resumes the finished task)."""
    script = tmp_path / "example.py"
    script.write_text(NAMED[name])
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (0, "") == (done.returncode, done.stderr)


def test_readme_examples_run_one_after_another_in_one_directory(tmp_path: Path) -> None:
    """Every example, run in turn in one directory (one ./.castore), twice: each has a task
    id of its own, so none resumes another's task with its own plan."""
    for round_ in range(2):
        for index, block in enumerate(BLOCKS):
            script = tmp_path / f"example_{index}.py"
            script.write_text(block)
            done = subprocess.run(
                [sys.executable, str(script)],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert (round_, index, 0, "") == (round_, index, done.returncode, done.stderr)


def test_readme_examples_pass_a_plain_mypy_run(tmp_path: Path) -> None:
    """A user's own mypy (no config of castore's) accepts every example as written."""
    pytest.importorskip("langgraph")
    files = []
    for index, block in enumerate(BLOCKS):
        files.append(tmp_path / f"example_{index}.py")
        files[-1].write_text(block)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), *map(str, files)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert (0, "") == (done.returncode, done.stderr), done.stdout


def test_the_durable_tool_example_keeps_its_protection_across_restarts(tmp_path: Path) -> None:
    """The durable_tool example keeps castore's store and the checkpoints in files, so run
    again (a restart) it answers the call from castore: the payment is not made again."""
    pytest.importorskip("langgraph")
    [block] = [b for b in BLOCKS if "durable_tool(" in b]
    assert (False, False) == ("mkdtemp" in block, ":memory:" in block)
    script = tmp_path / "tool.py"
    script.write_text(block)
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        outputs.append((done.returncode, done.stdout, done.stderr))
    assert [(0, "rcpt-1\n1\n", ""), (0, "rcpt-1\n0\n", "")] == outputs


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run ends with exactly the test command the README gives."""
    commands = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)[0].strip().splitlines()
    assert 2 == len(commands)
    ci_lines = (README.parent / ".ci" / "run").read_text().strip().splitlines()
    assert commands[1] == ci_lines[-1]


def _brief_sample() -> str:
    page = _page("howto/brief.md").read_text()
    found = re.search(r"```text\n(castore brief: .*?)```", page, re.S)
    assert found is not None
    return found.group(1)


def test_readme_brief_sample_is_what_castore_prints(tmp_path: Path) -> None:
    """The brief the docs show is the brief of the run it describes (HEAD's id aside: a snapshot
    holds its writer's random id): a refund marked UNRESOLVED 1.5 s after it was submitted."""
    now = [1_796_140_815_500]  # 2026-12-01T16:00:15.5Z, advanced by hand below
    store = castore.Store.open(tmp_path / "store", create=True, clock=lambda: now[0])
    bank = castore.Service("bank")  # it can neither deduplicate nor be asked
    plan = castore.Plan.grow("support-agent")
    with store.open_task("ticket-4711", plan, env="git:4f2c9e1") as run:
        for step, result in [
            ("think-1", {"tool": "lookup_order", "order": 17}),
            ("lookup-1", {"status": "paid twice"}),
            ("think-2", {"tool": "refund", "cents": 4200}),
        ]:
            now[0] += 1000
            run.append(step, result)
        now[0] += 1000
        with pytest.raises(ConnectionError), run.effect("refund-1", bank):
            raise ConnectionError("the connection dropped after the request left")
    with store.open_task("ticket-4711", plan, env="git:4f2c9e1") as run:
        now[0] += 1500
        run.settle(bank)
        made = str(run.brief())
    unmasked = re.compile(r"(?<=, head )[0-9a-f]{12}$", re.M)
    assert unmasked.sub("HEAD", _brief_sample()) == unmasked.sub("HEAD", made)
