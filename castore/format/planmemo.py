"""What is known of one Plan object, kept beside it for as long as it lives: that it is
valid, and its digest with the encoded meta that digest was made with (issue 26: a long
fixed plan is checked and hashed once per process, not at every resume).

Only a plan whose parts cannot change under it gets a memo: a frozen Plan of an exact str
name whose steps are plain (exact strs, bools and tuples; see plans._plain_steps). Its meta is
a dict, so the digest is kept with the meta's bytes and remade if they differ. The rules that
decide validity live in castore.format.plans; `Plan.build` vouches for the plans it makes,
whose shape it knows, so a built plan is not checked step by step again. (Plans are
`object` here: castore.format.records imports this module.)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable


class Memo:
    """The facts of one plan object. `valid`: it passed the plan rules. `ids`: its step ids,
    when `Plan.build` made it from ids alone, each step after the one before it and the
    first after none (`chained`), no step an effect. `digest`: its id, made while its meta
    encoded to `meta`."""

    __slots__ = ("digest", "ids", "meta", "ref", "valid")

    def __init__(self, ref: weakref.ref[object]) -> None:
        self.ref = ref
        self.valid = False
        self.ids: tuple[str, ...] | None = None
        self.digest: str | None = None
        self.meta: bytes | None = None

    @property
    def chained(self) -> bool:
        """Each step after the one before it, the first after none (`Plan.build` vouched)."""
        return self.ids is not None


# By id() of the plan (a Plan holds a dict, so it has no hash); an entry goes with its plan.
_MEMO: dict[int, Memo] = {}


def known(plan: object) -> Memo | None:
    """The memo of this very plan object, if it has one."""
    memo = _MEMO.get(id(plan))
    return memo if memo is not None and memo.ref() is plan else None


def remember(plan: object) -> Memo:
    """A new memo for `plan`, whose steps the caller knows to be plain and whose name is an
    exact str; it is dropped when the plan is."""
    key = id(plan)
    memo = Memo(weakref.ref(plan, _forget(key)))
    _MEMO[key] = memo
    return memo


def _forget(key: int) -> Callable[[object], None]:
    def forget(_: object) -> None:
        _MEMO.pop(key, None)

    return forget
