"""The README's examples run as written, and its two commands are the ones CI and users run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import castore

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_runnable_examples() -> None:
    """At least the library and side-effect examples are marked as runnable Python."""
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_twice_in_a_fresh_directory(index: int, tmp_path: Path) -> None:
    """Each example runs as written (twice: the second run resumes the finished task)."""
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
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
    found = re.search(r"```text\n(castore brief: .*?)```", README.read_text(), re.S)
    assert found is not None
    return found.group(1)


def test_readme_brief_sample_is_what_castore_prints(tmp_path: Path) -> None:
    """The README's brief is the brief of the run it describes (HEAD's id aside: a snapshot
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
