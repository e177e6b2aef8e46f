"""Plan validation, the plan digest, and the rolling digest of a growing plan."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

from castore.errors import UsageError
from castore.format import codec, planmemo
from castore.format.digest import hash_chunks
from castore.format.fastdecode import encode_sorted
from castore.format.records import Plan, Snapshot, Step

MAX_STEP_ID = 200
_STEP_DOMAIN = b"castore-plan-step\0"
_ID, _AFTER, _EFFECT = (operator.attrgetter(name) for name in ("id", "after", "effect"))
_SLICE = 4096  # steps encoded at a time: ~200 KB


def validate_step_id(step_id: object) -> None:
    """Refuse a step id castore could not record or print: not a non-empty printable str of
    at most MAX_STEP_ID characters."""
    if not isinstance(step_id, str) or not step_id or len(step_id) > MAX_STEP_ID:
        raise UsageError(f"step id {step_id!r}: use a non-empty str of at most {MAX_STEP_ID} chars")
    if not step_id.isprintable():  # status and log print it: one id, one line, as is
        raise UsageError(
            f"step id {step_id!r} is not printable (a control, format or separator "
            "character other than space); choose one that prints as itself"
        )


def _memo(plan: Plan, *, plain: bool = False) -> planmemo.Memo | None:
    """The memo of this very plan object (see castore.format.planmemo), made now if `plain`
    or if its steps are plain; None for a plan whose parts could change under it."""
    memo = planmemo.known(plan)
    if memo is not None:
        return memo
    if type(plan) is not Plan or type(plan.name) is not str or plan.grows not in (None, True):
        return None
    if not plain and not _plain_steps(plan.steps):
        return None
    return planmemo.remember(plan)


def validate_plan(plan: Plan) -> None:
    """Refuse a plan castore could not run: no steps (unless it grows), bad or duplicate
    ids, forward deps. Once per plan object that cannot change (see _memo)."""
    memo = _memo(plan)
    if memo is not None and memo.valid:
        return
    if memo is None or not _valid_plain(plan, ids=memo.ids):
        _validate(plan)  # the step by step check, and the one that says what is wrong
    if memo is not None:
        memo.valid = True


def _valid_plain(plan: Plan, *, ids: tuple[str, ...] | None = None) -> bool:
    """True if a plan of plain steps (`_plain_steps`) passes `_validate`, checked a whole
    sequence at a time in C, for the shapes `Plan.build` makes: each step after the one
    before, or after none; `ids`: the step ids of a plan `Plan.build` made from them (a
    chain: only the ids are looked at; planmemo). False means "look closer", never
    "invalid": `_validate` decides (and says what is wrong) for every other plan."""
    if plan.grows is not None and plan.grows is not True:
        return False
    steps = plan.steps
    if not steps:
        return bool(plan.grows)
    if ids is not None:
        return _valid_ids(ids)  # Plan.build's ids: no pass over the steps to collect them
    listed = list(map(_ID, steps))
    return _valid_ids(listed) and _chain_or_none(steps, listed)


def _valid_ids(ids: Sequence[str]) -> bool:
    """Each id of a printable length, printable, and none twice."""
    unique = set(ids)  # the costly pass (every id hashed): it answers "none empty" too
    # A concatenation prints as itself exactly when each of its parts does.
    return (
        len(unique) == len(ids)
        and "" not in unique
        and max(map(len, ids)) <= MAX_STEP_ID
        and "".join(ids).isprintable()
    )


def _chain_or_none(steps: tuple[Step, ...], ids: list[str]) -> bool:
    """No step after any other, or a chain: step 0 after none, each later step after
    exactly one, and that one (in order) the step before it."""
    afters = list(map(_AFTER, steps))
    deps = list(itertools.chain.from_iterable(afters))
    return not deps or (
        afters[0] == ()
        and set(map(len, itertools.islice(afters, 1, None))) == {1}
        and deps == ids[:-1]
    )


def _validate(plan: Plan) -> None:
    if plan.grows is not None and plan.grows is not True:
        raise UsageError(f"plan {plan.name!r}: grows is True or None, not {plan.grows!r}")
    if not plan.steps and not plan.grows:
        raise UsageError(
            f"plan {plan.name!r} has no steps; give it at least one (or make it a growing "
            "plan with Plan.grow, whose steps are decided as the task runs)"
        )
    seen: set[str] = set()
    for step in plan.steps:
        validate_step_id(step.id)
        if step.id in seen:
            raise UsageError(f"plan {plan.name!r} has step {step.id!r} twice; step ids are unique")
        for dep in step.after:
            if dep not in seen:
                raise UsageError(
                    f"step {step.id!r} runs after {dep!r}, which is not an earlier step; "
                    "list steps in an order that respects their dependencies"
                )
        seen.add(step.id)


def plan_bytes(plan: Plan) -> bytes:
    """The framed object bytes of a plan."""
    return b"".join(_plan_pieces(plan))


def _plan_pieces(
    plan: Plan, *, plain: bool | None = None, ids: tuple[str, ...] | None = None
) -> list[bytes | memoryview]:
    """The framed bytes of a plan, in pieces whose concatenation they are. Every resume
    hashes the caller's plan: its steps (all of the bytes of a long plan) are written around
    their `ids` when Plan.build made them from those, else encoded in C, a slice at a time,
    when they hold exact types only; the name and meta as any record's fields are; anything
    else takes the general path, in one piece."""
    version = 2 if plan.grows is not None else None  # a v1 reader knows no growing plan
    if plain is None:
        plain = _plain_steps(plan.steps)
    if not plain or plan.grows not in (None, True):
        return [_general_bytes(plan, version)]
    steps = _chain_text(ids) if ids else None
    if steps is None:
        steps = _encoded_steps(plan.steps)
    if steps is None:  # a lone surrogate: the general path says where
        return [_general_bytes(plan, version)]
    head = b'{%s"meta":%s,"name":%s,"steps":' % (
        b'"grows":true,' if plan.grows else b"",
        codec.encode_value(codec.to_builtins(plan.meta)),
        codec.encode_value(plan.name),
    )
    body = [head, *steps, b"}"]
    return [codec.frame_header("plan", sum(map(len, body)), version), *body]


def _general_bytes(plan: Plan, version: int | None) -> bytes:
    return codec.frame("plan", codec.encode_value(codec.to_builtins(plan)), version)


def _encoded_steps(steps: tuple[Step, ...]) -> list[bytes | memoryview] | None:
    """`steps` as one JSON array, in pieces of at most _SLICE steps: never a copy of the
    whole (a plan of 1,000,000 steps is 50 MB); None where msgspec refuses a step."""
    if not steps:
        return [b"[]"]
    pieces: list[bytes | memoryview] = []
    for start in range(0, len(steps), _SLICE):
        encoded = encode_sorted(steps[start : start + _SLICE])  # b"[...]"
        if encoded is None:
            return None
        pieces += [b"," if pieces else b"[", memoryview(encoded)[1:-1]]
    return [*pieces, b"]"]


# Plan.build's steps as JSON around their ids (keys sorted: after, effect, id): the first
# step after none, each next one after the id before it.
_FIRST_STEP = b'[{"after":[],"effect":false,"id":"'
_NEXT_STEP = '"},{"after":["'  # closes a step and opens the next, whose `after` follows
_ITS_ID = '"],"effect":false,"id":"'


def _chain_text(ids: tuple[str, ...]) -> list[bytes | memoryview] | None:
    """The steps Plan.build makes of `ids` as one JSON array, written around the ids a slice
    at a time (about four times faster than encoding the records: issue 26). A printable id
    without a quote or a backslash is its own JSON text between quotes (the canonical
    encoding escapes nothing else that prints); None for any other id (msgspec escapes)."""
    pieces: list[bytes | memoryview] = []
    for start in range(0, len(ids), _SLICE):
        part = ids[start : start + _SLICE]
        text = "".join(part)
        if '"' in text or "\\" in text or not text.isprintable():
            return None
        # A slice's steps that follow another (all but the plan's first), and the ids they follow.
        follow = part[1:] if start == 0 else part
        before = ids[start - 1 : start + len(part) - 1] if start else part[:-1]
        words = [""] * (4 * len(follow))
        words[0::4] = [_NEXT_STEP] * len(follow)
        words[1::4] = before
        words[2::4] = [_ITS_ID] * len(follow)
        words[3::4] = follow
        pieces.append("".join(words).encode())
    return [_FIRST_STEP + ids[0].encode(), *pieces, b'"}]']


def _plain_steps(steps: object) -> bool:
    """True if `steps` is a tuple of Steps made of exact strs and bools (what the general
    path encodes the same way, fastdecode.encode_sorted); whole-sequence checks, in C."""
    if type(steps) is not tuple or not set(map(type, steps)) <= {Step}:
        return False
    afters = list(map(_AFTER, steps))
    return (
        set(map(type, map(_ID, steps))) <= {str}
        and set(map(type, map(_EFFECT, steps))) <= {bool}
        and set(map(type, afters)) <= {tuple}
        and set(map(type, itertools.chain.from_iterable(afters))) <= {str}
    )


def plan_id(plan: Plan) -> str:
    """The plan digest: the id its object has (or would have) in any store. Hashed once per
    plan object that cannot change (see _memo), and again only if its meta did."""
    memo = _memo(plan)
    if memo is None:
        return hash_chunks(_plan_pieces(plan))
    meta = codec.encode_value(codec.to_builtins(plan.meta))
    if memo.digest is None or memo.meta != meta:
        pieces = _plan_pieces(plan, plain=True, ids=memo.ids)
        memo.digest, memo.meta = hash_chunks(pieces), meta
    return memo.digest


def remember_digest(plan: Plan, digest: str) -> None:
    """Record that `digest` is `plan`'s (a plan decoded from canonical bytes that hashed to
    it), so a later plan_id(plan) need not encode it again. Decoded by msgspec into the
    records, its steps are plain (exact strs, bools, tuples) without looking."""
    memo = _memo(plan, plain=True)
    if memo is not None:
        memo.digest, memo.meta = digest, codec.encode_value(codec.to_builtins(plan.meta))


def roll_digest(digest: str, step: Step, args: str | None) -> str:
    """d(n+1) from d(n): the plan digest once `step` (with journaled-call argument digest
    `args`) is decided after the steps `digest` covers (docs/FORMAT.md 7.9)."""
    entry = codec.encode_value({"args": args, "effect": step.effect, "id": step.id})
    return hash_chunks([_STEP_DOMAIN, digest.encode(), b"\0", entry])


def head_digest(snapshot: Snapshot) -> str:
    """The plan digest at `snapshot`: the rolling digest of a growing plan (every step
    decided so far), else the plan object id."""
    grown = snapshot.grown
    return grown.digest if grown is not None else snapshot.plan
