"""The tree shows the layers (issue 24): imports point down, no module imports in a circle,
no module is too long, only the medium touches the filesystem, and each third-party library
has one importer.

The floors, bottom first (each package's docstring says what it owns and may import):

    0  castore.errors, castore.crashpoints     imported by everything; import no castore module
    1  castore.format                          bytes and names: codec, records, layout, rules
    2  castore.medium                          the place that holds objects and chain slots
    3  castore.chain                           objects, slots, marks, packs, verification, seal
    4  castore.run                             every writer of a task: the run, the protocol
    5  castore.store                           the facade: open a store, start and resume tasks
    6  castore.maintenance                     gc, fsck, upgrade, retention, reclaim
    6.5  castore (its __init__)                the public API, which adapters use as a user would
    7  adapters: aio, langgraph, watch, doctor, lab, ui, cli, and castore.__main__

A module may import modules of its own floor and below; adapters may import each other only
as listed in ADAPTER_EDGES (the CLI drives the others; the lab and doctor are the CLI's too).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "castore"
MAX_LINES = 450

FLOORS: dict[str, float] = {
    "castore.errors": 0,
    "castore.crashpoints": 0,
    "castore.format": 1,
    "castore.medium": 2,
    "castore.chain": 3,
    "castore.run": 4,
    "castore.store": 5,
    "castore.maintenance": 6,
    "castore.aio": 7,
    "castore.langgraph": 7,
    "castore.watch": 7,
    "castore.doctor": 7,
    "castore.lab": 7,
    "castore.cli": 7,
    "castore.ui": 7,
    "castore": 6.5,  # castore/__init__.py: the public API
    "castore.__main__": 7,
}
# Which adapter may import which (the CLI is the top; the rest stand side by side).
ADAPTER_EDGES = {
    ("castore.cli", "castore.watch"),
    ("castore.cli", "castore.doctor"),
    ("castore.cli", "castore.lab"),
    ("castore.cli", "castore.langgraph"),
    ("castore.cli", "castore.ui"),
    ("castore.ui", "castore.langgraph"),  # a LangGraph thread's node names and checkpoints
    ("castore.lab", "castore.aio"),
    ("castore.langgraph", "castore.lab"),
    ("castore.langgraph", "castore.aio"),
    ("castore.__main__", "castore.cli"),
}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = modules()


def imports_of(name: str, path: Path) -> set[str]:
    """The castore modules `name` imports, anywhere in it (also inside functions and under
    TYPE_CHECKING: a circle of annotations is still a circle to whoever reads the code)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                found.add(candidate if candidate in MODULES else module)
    return {target for target in found if target in MODULES and target != name}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def floor_package(name: str) -> str:
    """The entry of FLOORS that `name` belongs to (its longest matching prefix)."""
    best = ""
    for package in FLOORS:
        if (name == package or name.startswith(package + ".")) and len(package) > len(best):
            best = package
    if not best:
        raise AssertionError(f"{name} is in no floor: add its package to FLOORS")
    return best


def test_every_module_is_on_a_floor() -> None:
    """Every module of castore/ belongs to a package of a known floor."""
    for name in MODULES:
        floor_package(name)


def test_imports_point_down() -> None:
    """A module imports only its own floor and the floors below (adapters: as listed)."""
    wrong = []
    for name, targets in GRAPH.items():
        mine = floor_package(name)
        for target in targets:
            theirs = floor_package(target)
            if theirs == mine or FLOORS[theirs] < FLOORS[mine]:
                continue
            if (mine, theirs) in ADAPTER_EDGES:
                continue
            wrong.append(f"{name} (floor {FLOORS[mine]}) imports {target} (floor {FLOORS[theirs]})")
    assert [] == sorted(wrong)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in order, the first repeated at the end)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_circles() -> None:
    """No module of castore/ reaches itself through its imports; the circle is named."""
    cycle = find_cycle(GRAPH)
    assert cycle is None, "an import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_circle() -> None:
    """Self-test: a planted circle of three is found and named in order."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert ["a", "b", "c", "a"] == find_cycle(graph)
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_too_long(name: str) -> None:
    """Small modules with one job each: none over ~450 lines."""
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines"


def test_every_package_says_what_it_owns() -> None:
    """Each package opens with a docstring saying what it owns and what it may import."""
    for name, path in MODULES.items():
        if path.name == "__init__.py":
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            assert doc, f"package {name} has no docstring"
            assert "import" in doc, f"package {name}'s docstring does not say what it may import"


# -- the medium seam: only the medium touches the filesystem ----------------------------------
# Calls that touch a filesystem (or reach into its metadata) by a path or a descriptor.
FS_CALLS = {
    "os": {
        "open",
        "close",
        "read",
        "write",
        "fsync",
        "fdatasync",
        "lstat",
        "stat",
        "fstat",
        "listdir",
        "scandir",
        "walk",
        "unlink",
        "remove",
        "rmdir",
        "mkdir",
        "makedirs",
        "link",
        "rename",
        "replace",
        "symlink",
        "readlink",
        "utime",
        "chmod",
        "fchmod",
        "ftruncate",
        "truncate",
        "access",
    },
    "os.path": {
        "exists",
        "lexists",
        "isdir",
        "isfile",
        "islink",
        "getmtime",
        "getsize",
        "samefile",
    },
    "shutil": {"copy", "copy2", "copyfile", "copytree", "rmtree", "move"},
}
# Who may, and why. Everything else reaches the store only through castore.medium.
FS_ALLOWED = {
    "castore.medium": "the medium itself: the POSIX directory's system calls",
    "castore.doctor": "probes the filesystem itself: that is what it tests",
    "castore.lab": "the crash lab's own files (the service's ledger, the model's log)",
    "castore.cli": "paths a person typed (is this a directory? does it hold .castore?)",
    "castore.watch.observer": "watchdog's view of a directory (the only importer of watchdog)",
    "castore.format.envdigest": "digests a user's files for an environment anchor, not the store's",
    "castore.run.inflight": "reads /proc for a process's start time, never the store",
}


def _fs_calls(path: Path) -> list[str]:
    """`module.function` for every call of FS_CALLS in the file, and every use of fsio."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "castore.medium":
            found += [f"imports castore.medium.{a.name}" for a in node.names if a.name == "fsio"]
        if isinstance(node, ast.ImportFrom) and node.module == "castore.medium.fsio":
            found.append("imports castore.medium.fsio")
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id == "open":
            found.append("open()")
        target = node.func
        if not isinstance(target, ast.Attribute):
            continue
        owner = ast.unparse(target.value)
        if target.attr in FS_CALLS.get(owner, ()):
            found.append(f"{owner}.{target.attr}()")
    return found


def test_only_the_medium_touches_the_filesystem() -> None:
    """No module outside castore.medium (and the exceptions FS_ALLOWED names, each with its
    reason) makes a filesystem call or uses fsio: a second medium needs no change above it."""
    wrong = {}
    for name, path in MODULES.items():
        if any(name == p or name.startswith(p + ".") for p in FS_ALLOWED):
            continue
        calls = _fs_calls(path)
        if calls:
            wrong[name] = sorted(set(calls))
    assert {} == wrong


def test_the_filesystem_check_sees_a_call() -> None:
    """Self-test: the check finds os.lstat, os.path.isdir, open() and an fsio import."""
    source = (
        "import os\nfrom castore.medium import fsio\nos.lstat('x'); os.path.isdir('y'); open('z')\n"
    )
    here = Path(__file__).resolve().parent / "_fs_probe.py"
    try:
        here.write_text(source)
        calls = _fs_calls(here)
    finally:
        here.unlink()
    assert {"os.lstat()", "os.path.isdir()", "open()", "imports castore.medium.fsio"} == set(calls)


# -- third-party dependencies: each imported by exactly one module ----------------------------
def third_party_imports(path: Path) -> set[str]:
    """The top-level names of the non-stdlib, non-castore packages a file imports, anywhere."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return {n for n in found if n not in sys.stdlib_module_names and n not in ("castore",)}


def test_each_third_party_dependency_has_one_importer() -> None:
    """A third-party library is imported by exactly one castore module (the brief's rule):
    the one place to change when it changes, and the one place that knows its API."""
    importers: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for package in third_party_imports(path):
            importers.setdefault(package, []).append(name)
    shared = {package: names for package, names in importers.items() if len(names) > 1}
    assert {} == shared
    # The owners, so that a new dependency is a decision someone sees in review.
    assert {
        "attrs": ["castore.format.model"],
        "cattrs": ["castore.format.codec"],
        "blake3": ["castore.format.digest"],
        "msgspec": ["castore.format.fastdecode"],
        "filelock": ["castore.medium.tasklock"],
        "botocore": ["castore.medium.s3client"],
        "watchdog": ["castore.watch.observer"],
        "langgraph": ["castore.langgraph.deps"],
        "langchain_core": ["castore.langgraph.deps"],
        "pydantic": ["castore.langgraph.tool"],
        "starlette": ["castore.ui.app"],
        "uvicorn": ["castore.ui.server"],
        "jinja2": ["castore.ui.pages"],
    } == importers


def test_the_dependency_check_sees_a_second_importer(tmp_path: Path) -> None:
    """Self-test: both spellings of an import are seen, and stdlib names are not counted."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nimport attrs\nfrom msgspec import json\nfrom . import x\n")
    assert {"attrs", "msgspec"} == third_party_imports(probe)
