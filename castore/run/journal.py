"""Journaled calls: run a non-effect call (a model completion) once, record its result, and
return the recorded result on every replay instead of calling again.

The call is one generator (`call_steps`) that yields a single `Invoke` where the caller's
function must run; `Run.call` drives it with a plain call, `AsyncRun.call` with an await, so
the rules below exist once. The result is recorded as the step's result: inline when its
canonical encoding is small, as a blob when larger than INLINE_RESULT_BYTES (or vouched for),
as a raw object when it is bytes. The first call returns the decoded recording too, so a
replay returns exactly what the first run returned (a tuple comes back a list both times).

The secret guard judges the result like any payload. Model output that quotes a credential
shape on purpose is vouched for by wrapping the callable: `run.call("answer",
castore.vouch(model.complete, "$.content"), prompt)` trusts the `content` field of the
result (a path relative to the result, or a bare key name); `castore.vouch(fn)` trusts the
whole result. A vouched result is stored as a blob, never inline in the snapshot.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from castore.chain.trees import RawRef, TreeRef, raw_bytes
from castore.errors import EncodingError, ReplayDriftError, SecretInPayloadError, UsageError
from castore.format import codec, guard
from castore.format.digest import hash_bytes
from castore.format.model import attrs
from castore.format.records import BlobRef
from castore.run import inflight, protocol
from castore.run.contract import Position, RunView

# Larger results go to a blob: the snapshot stays small and under its budget (64 KiB).
INLINE_RESULT_BYTES = 4096
_WHOLE = "$"
_REFS = (BlobRef, RawRef, TreeRef)
_PLAIN = (
    "return None, bool, int, float, str, lists and str-keyed dicts of those, or bytes "
    "(stored as a raw object); convert an SDK response first (e.g. response.model_dump())"
)


@attrs.frozen
class Invoke:
    """The call generator's one request: call the function now, send its result in."""


@attrs.frozen
class Vouched:
    """A callable whose result the caller vouches for at `fields` (see the module doc)."""

    fn: Callable[..., Any]
    fields: tuple[str, ...]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def vouch(fn: Callable[..., Any], *fields: str) -> Vouched:
    """Wrap `fn` so the secret guard trusts its result at `fields`: paths relative to the
    result ("$.content", "$.message.text") or bare key names ("content"); none: all of it."""
    for field in fields:
        if not isinstance(field, str) or not field:
            raise UsageError(
                f"vouch takes field paths like '$.content' or key names, not {field!r}"
            )
    return Vouched(fn, tuple(fields) or (_WHOLE,))


def is_async(fn: Callable[..., Any]) -> bool:
    """True if calling `fn` gives a coroutine to await (a vouched coroutine function too)."""
    inner = fn.fn if isinstance(fn, Vouched) else fn
    return inspect.iscoroutinefunction(inner)


def args_digest(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """blake3 of the canonical encoding of {"args": [...], "kwargs": {...}}: what a replay
    compares to tell the same call from a different one at the same position."""
    try:
        encoded = codec.encode_value({"args": list(args), "kwargs": dict(kwargs)})
    except EncodingError as exc:
        where = exc.path.replace("$.args", "argument ", 1).replace("$.kwargs.", "keyword ", 1)
        raise EncodingError(
            where,
            exc.reason,
            "a journaled call's arguments are recorded by digest, so they must be plain "
            "data (None, bool, int, float, str, lists and str-keyed dicts); bind other "
            "objects (a client, a callback) into the function instead",
        ) from exc
    return hash_bytes(encoded)


def call_steps(
    run: RunView,
    step_id: str,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Generator[Invoke, Any, Any]:
    """The journaled call: the recorded result of a done step, else one `Invoke` and the
    commit of its result (durable before this returns). StepInFlightError while a call of it
    still runs in any run of this process (castore.run.inflight)."""
    digest = args_digest(args, kwargs)
    if _replayed(run, step_id, digest):
        return run.result(step_id)
    inflight.refuse(run, step_id, f"calling step {step_id!r} again")
    with inflight.sending(run, step_id):
        result = yield Invoke()
    fields = fn.fields if isinstance(fn, Vouched) else ()
    stored, value = _recorded(run, step_id, result, fields)
    # The digest is a format-2 field: a v1 store keeps v1 bytes (no argument check there).
    run.commit_step(step_id, stored, args=digest if run.writes_v2 else None)
    # A reference the function returned is loaded, as every replay loads it.
    return run.result(step_id) if isinstance(result, _REFS) else value


def call(
    run: RunView,
    step_id: str,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    """Drive `call_steps` with a plain call of `fn` (the sync `Run.call`)."""
    if is_async(fn):
        raise UsageError(
            f"call {step_id!r}: {fn!r} is a coroutine function; await it through "
            "castore.aio (AsyncRun.call), or pass a plain function"
        )
    return protocol.drive(call_steps(run, step_id, fn, args, kwargs), lambda _: fn(*args, **kwargs))


def _replayed(run: RunView, step_id: str, digest: str) -> bool:
    """True if the step is recorded (its result stands); refuse a call that cannot be the
    next step before the function runs, so nothing is paid for in vain.

    A growing plan goes through the replay cursor (`run.at`): a new step is decided,
    durably, before the call; at a recorded position another step or other arguments are
    drift. A fixed plan keeps its forgiving rule (a done step replays wherever the code
    asks for it), with the same argument check when the digest was recorded."""
    if run.grows:
        return run.at(step_id, args=digest) is Position.DONE
    if run.done(step_id):
        outcome = run.outcome(step_id)
        if outcome.args not in (None, digest):
            raise ReplayDriftError(
                run.task_id,
                run.plan.index(step_id),
                step_id,
                step_id,
                what=f"recorded with arguments {outcome.args}, now called with {digest}",
                recorded_args=outcome.args,
                requested_args=digest,
            )
        return True
    if run.next_step != step_id:
        raise UsageError(
            f"call {step_id!r} is not the next step of task {run.task_id!r} "
            f"(next: {run.next_step!r}); steps run in plan order"
        )
    if run.plan.steps[run.head.frontier.index].effect:
        raise UsageError(
            f"step {step_id!r} of task {run.task_id!r} is an effect: run it with "
            "run.perform(...) or run.effect(...), not run.call"
        )
    return False


def _recorded(run: RunView, step_id: str, result: Any, fields: tuple[str, ...]) -> tuple[Any, Any]:
    """(what the step records, what the call returns) for `result`, after the payload rules;
    a blob or raw object is stored here, before the commit that names it."""
    if isinstance(result, _REFS):
        return result, None
    if isinstance(result, bytes | bytearray | memoryview):
        data = bytes(result)
        if not run.writes_v2:
            raise UsageError(
                f"call {step_id!r} of task {run.task_id!r} returned bytes, stored as a raw "
                "object (format 2); run `castore upgrade` on the store, or return a str"
            )
        return RawRef(run.objects.put_framed(raw_bytes(data))), data
    try:
        encoded = codec.encode_value(result)
    except EncodingError as exc:
        raise codec.told_of_result(
            exc,
            f"call {step_id!r} of task {run.task_id!r}",
            "$",
            f"{_not_recorded(run)}; {_PLAIN}, then {_again(run)}",
        ) from exc
    value = codec.decode_value(encoded)  # what every replay returns
    as_blob = bool(fields) or len(encoded) > INLINE_RESULT_BYTES
    base = "$" if as_blob else "$.transition.result"
    if _WHOLE not in fields:
        _guard(run, step_id, value, base, fields)
    if as_blob:
        return BlobRef(run.objects.put("blob", encoded)), value
    return value, value


def _guard(run: RunView, step_id: str, value: Any, base: str, fields: tuple[str, ...]) -> None:
    allow = [*run.allow_fields, *(base + f[1:] if f.startswith("$") else f for f in fields)]
    try:
        guard.refuse_secrets(value, allow, base)
    except SecretInPayloadError as exc:
        raise SecretInPayloadError(
            f"{exc.path} (the result of call {step_id!r}, task {run.task_id!r})",
            f"{exc.why}; {_not_recorded(run)}. If it is model output you trust, vouch for "
            f"it: run.call({step_id!r}, castore.vouch(fn, '$.field'), ...), then "
            f"{_again(run)}",
        ) from exc


def _not_recorded(run: RunView) -> str:
    """What a refused result leaves: nothing on a fixed plan; on a growing plan the step's
    decision, committed before the function ran, which pins the task to that step."""
    if not run.grows:
        return "nothing was recorded"
    return (
        "the result was not recorded, but the step's decision was (committed before the call, "
        f"at position {run.head.frontier.index}, with its arguments): the task stays at this "
        "step until its call returns a result castore can record"
    )


def _again(run: RunView) -> str:
    """How the call is made again: the same code, never a value committed in its place."""
    if not run.grows:
        return "call it again"
    return (
        "run the same code on the task again (store.open_task): the same run.call at this "
        "position, with the same step id and arguments, calls the function again"
    )
