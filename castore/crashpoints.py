"""Named crash points: SIGKILL this process at a chosen durable transition, for crash tests.

`CASTORE_CRASH_AT=name[:nth]` arms one point (the nth time it is reached, default 1).
`CASTORE_PAUSE_AT=name[:nth]` stops the process there instead (SIGSTOP), so a test can run
something else in the middle of a commit or a gc and then let it go on with SIGCONT. The
variables are read once at import; an unarmed point costs one comparison.

A test's interleaving scheduler (tests/interleave.py) may install a hook that every point
calls, in the thread that reaches it, and that `wait` calls just before castore blocks on
another thread of its own (a sealer's queue, a drain): the scheduler then runs one thread at a
time and chooses, at each point, which goes on. Without a hook, `wait` does nothing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

# (point, None) at a point; (point, ready) where the caller is about to block until ready().
Hook = Callable[[str, Callable[[], bool] | None], None]

ENV_VAR = "CASTORE_CRASH_AT"
PAUSE_VAR = "CASTORE_PAUSE_AT"

# Every point castore offers, in the order a commit reaches them. docs/FORMAT.md lists them.
POINTS = (
    "init.root",
    "init.tasks",
    "object.temp_created",
    "object.mid_write",
    "object.temp_synced",
    "object.linked",
    "object.published",
    "commit.before_link",
    "commit.linked",
    "commit.done",
    "mark.before_write",
    "mark.written",
    "prune.slot_removed",
    "effect.submitted",
    "effect.sent",
    "effect.confirmed",
    "grow.decided",
    "seal.pack_written",
    "seal.committed",
    "seal.mark_written",
    "seal.pruned",
    "reclaim.marked",
    "reclaim.pruned",
    "gc.slots_read",
    "gc.set_aside",
    "gc.reread",
    "quarantine.moved",
    "upgrade.verified",
    "upgrade.marker_written",
    "upgrade.sealed",
)

# The crash lab's sample agent (castore/lab/agent.py): moments of an agent loop, not durable
# transitions of the store, so FORMAT.md does not list them. Kept apart from POINTS so that
# campaigns choosing among POINTS keep their schedules.
LAB_POINTS = (
    "agent.model_answered",
    "agent.thought",
    "agent.tool_returned",
    "agent.acted",
    "agent.answered",
)

# castore.langgraph's rewrite of a thread (prune, delete_for_runs), between its commits.
LG_POINTS = ("lgprune.intent", "lgprune.copy_started", "lgprune.copied", "lgprune.switched")


def _parse(var: str) -> tuple[str, int] | None:
    spec = os.environ.get(var)
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    if name not in (*POINTS, *LAB_POINTS, *LG_POINTS):
        known = ", ".join((*POINTS, *LAB_POINTS, *LG_POINTS))
        raise ValueError(f"{var}={spec!r}: unknown crash point; known: {known}")
    return name, int(nth) if nth else 1


_armed = _parse(ENV_VAR)
_paused = _parse(PAUSE_VAR)
_seen: dict[str, int] = {}
_hook: Hook | None = None


def install_hook(hook: Hook | None) -> None:
    """Call `hook` at every point and wait from now on (None: stop). For tests only."""
    global _hook  # noqa: PLW0603 - one switch for the whole process, as the variables are
    _hook = hook


def wait(name: str, ready: Callable[[], bool]) -> None:
    """The caller is about to block until `ready()` holds (another castore thread's work):
    a point the interleaving hook resumes only once it holds. Nothing without a hook."""
    if _hook is not None:
        _hook(name, ready)


def armed(name: str) -> bool:
    """True if `name` is the armed point (whatever its count): lets callers split a write."""
    return _armed is not None and _armed[0] == name


def reach(name: str) -> None:
    """Die by SIGKILL if `name` is the armed point and this is its nth arrival; stop (until
    SIGCONT) if it is the paused point and this is its nth arrival."""
    if _hook is not None:
        _hook(name, None)
    if (_armed is None or _armed[0] != name) and (_paused is None or _paused[0] != name):
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _armed is not None and _armed == (name, _seen[name]):
        os.kill(os.getpid(), signal.SIGKILL)
    if _paused is not None and _paused == (name, _seen[name]):
        os.kill(os.getpid(), signal.SIGSTOP)
