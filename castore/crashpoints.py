"""Named crash points: SIGKILL this process at a chosen durable transition, for crash tests.

`CASTORE_CRASH_AT=name[:nth]` arms one point (the nth time it is reached, default 1). The
variable is read once at import; an unarmed point costs one comparison.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "CASTORE_CRASH_AT"

# Every point castore offers, in the order a commit reaches them. docs/FORMAT.md lists them.
POINTS = (
    "object.temp_created",
    "object.mid_write",
    "object.temp_synced",
    "object.linked",
    "object.published",
    "commit.before_link",
    "commit.linked",
    "commit.done",
    "effect.submitted",
    "effect.sent",
    "effect.confirmed",
)


def _parse(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    if name not in POINTS:
        raise ValueError(f"{ENV_VAR}={spec!r}: unknown crash point; known: {', '.join(POINTS)}")
    return name, int(nth) if nth else 1


_armed = _parse(os.environ.get(ENV_VAR))
_seen: dict[str, int] = {}


def armed(name: str) -> bool:
    """True if `name` is the armed point (whatever its count): lets callers split a write."""
    return _armed is not None and _armed[0] == name


def reach(name: str) -> None:
    """Die by SIGKILL if `name` is the armed point and this is its nth arrival."""
    if _armed is None or _armed[0] != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == _armed[1]:
        os.kill(os.getpid(), signal.SIGKILL)
