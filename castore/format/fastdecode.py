"""A fast path for reading object bodies that are already canonical: msgspec parses and
type-checks a body in C, straight into the attrs records, and re-encoding the result must
give back the very same bytes.

`codec` (strict JSON decoding, then cattrs) stays the definition of a valid body and the
source of every error message. This path only ever answers "valid, here is the value" or
"not sure": it never rejects. It accepts a body only where the strict path provably would,
with an equal value:
- msgspec's sorted-key encoding equals the canonical encoding for every string (checked for
  every code point), every key order and every int; re-encoding to the same bytes therefore
  rules out extra keys, duplicate keys, missing defaults, whitespace and other escapes;
- floats differ only in exponent form (msgspec writes 1e16 where Python writes 1e+16), so a
  float whose canonical text has an exponent sends the body to the strict path;
- msgspec reads ints up to 2**64 - 1 and wider, the data model stops at signed 64 bits, so a
  run of 19 or more digits anywhere (even inside a string) sends the body to the strict path.
For fsck's hot loop, `canonical_view` reads a body into a *view* instead: a frozen msgspec
Struct generated from the attrs record, with the same field names, types, defaults and
values, which msgspec builds and re-encodes in about 60% of the time. A view bounds every
typed int to 64 bits itself, so only the values of `Any` fields need their ints checked,
which is done on the decoded value rather than by scanning the body for digits.
This is the only module that imports msgspec.
"""

from __future__ import annotations

import contextlib
import gc
import math
import types
import typing
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

import msgspec

from castore.format.limits import MAX_DEPTH
from castore.format.model import attrs
from castore.format.records import Plan, omitted_fields

T = TypeVar("T")

# 2**63 has 19 digits: every int outside the data model has at least that many. A JSON
# number's digits follow a sign, a point, a bracket, a comma, a colon or a space, never a
# letter or a quote: digits after those are inside a string (a hex id holds runs of 19
# digits in ~0.3% of snapshots, which all took the strict path, ~30x slower, before).
# Mapping digits to "0", letters and quotes to "a" and the rest to " " turns the search
# into a substring test (a regex costs ten times more; this runs on every object read).
_NUMBER_CLASSES = (
    bytes(
        0x30 if 0x30 <= byte <= 0x39 else 0x61 if chr(byte).isalpha() or byte == 0x22 else 0x20
        for byte in range(128)
    )
    + b" " * 128
)
_LONG_DIGIT_RUN = b"0" * 19
_LONG_NUMBER = b" " + _LONG_DIGIT_RUN


def may_hold_a_long_number(body: bytes) -> bool:
    """True if `body` has a run of 19 or more digits outside a string's letters: a JSON
    number that may not be a 64-bit int (msgspec would accept it), so the strict path
    decides. False guarantees every number of `body` has fewer than 19 digits."""
    translated = body.translate(_NUMBER_CLASSES)
    return _LONG_NUMBER in translated or translated.startswith(_LONG_DIGIT_RUN)


class _NotPlain(Exception):
    """A float whose canonical text would differ from msgspec's."""


def _plain_float(text: str) -> float:
    """msgspec's hook for every float of an untyped (Any) field: the records have no float
    fields, so this sees them all."""
    value = float(text)
    if not math.isfinite(value) or "e" in repr(value):
        raise _NotPlain(text)
    return value


# What msgspec (or the float hook) may raise for a body it cannot vouch for.
_UNSURE = (msgspec.MsgspecError, _NotPlain, ValueError, TypeError, OverflowError, RecursionError)
_ENCODER = msgspec.json.Encoder(order="sorted")


def encode_sorted(value: object) -> bytes | None:
    """msgspec's sorted-key compact JSON of `value`, attrs records included; None where msgspec
    refuses it (a lone surrogate, deep nesting). It is the canonical encoding (module
    docstring) when `value` holds only exact strs, bools, None, 64-bit ints, floats whose
    canonical text has no exponent, tuples, lists, dicts with str keys and records of them:
    the caller sees to that. In C: a plan of 100,000 steps in ~30 ms instead of ~1 s through
    cattrs, a snapshot in ~1 µs instead of ~8."""
    try:
        return _ENCODER.encode(value)
    except _UNSURE:
        return None


def decode_json(data: bytes) -> Any:
    """Any JSON document, parsed in C (objects as dicts): the S3 client's SDK model files,
    which json.loads takes a third of a worker's client start to parse."""
    return msgspec.json.decode(data)


_DECODERS: dict[object, Callable[[bytes], Any]] = {}


def canonical_decoder(cls: type[T]) -> Callable[[bytes], T | None]:
    """A function from a body to the record of type `cls` it encodes, if the body is its
    canonical encoding, else None (the strict path in `codec` then decides). Made once per
    type and kept: fsck calls it for every snapshot."""
    try:
        return _DECODERS[cls]
    except KeyError:
        pass
    decoder = msgspec.json.Decoder(cls, float_hook=_plain_float)
    encode = _ENCODER.encode
    omitted = _omitted_members(cls)
    too_deep_record = _DEPTH_CHECKS.get(cls, _deeper_than_allowed)

    def decode(body: bytes) -> T | None:
        if may_hold_a_long_number(body):
            return None
        try:
            with _collector_paused(len(body)):
                record: T = decoder.decode(body)
            again = encode(record)
        except _UNSURE:
            return None  # the strict path will say what is wrong, if anything is
        for path, member in omitted:
            if _at(record, path) is None:  # msgspec writes it; the canonical encoding not
                again = again.replace(member, b"", 1)
        return record if again == body and not too_deep_record(body, record) else None

    _DECODERS[cls] = decode
    return decode


def _plan_too_deep(body: bytes, plan: Any) -> bool:
    """`_deeper_than_allowed` for a plan, without walking its steps: the typed fields nest
    4 deep at most (plan, steps, step, after), so only `meta` (its dict at depth 2) can
    exceed MAX_DEPTH. A 100,000-step plan has 200,000 brackets; the walk took ~350 ms."""
    return too_deep(plan.meta, MAX_DEPTH - 1)


_DEPTH_CHECKS: dict[type, Callable[[bytes, Any], bool]] = {Plan: _plan_too_deep}
_PAUSE_ABOVE = 1 << 20  # bytes of body


@contextlib.contextmanager
def _collector_paused(size: int) -> Iterator[None]:
    """The cyclic collector off while a large body (a long plan) is built: its objects are
    new, so every pass would walk them all again (a 5 MB plan decodes in ~35 ms paused,
    ~135 ms not). Left as the caller had it; a small body is not worth the global switch.
    The switch is process-wide: another thread that disables the collector meanwhile finds
    it enabled again when this decode ends."""
    if size <= _PAUSE_ABOVE or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _omitted_members(cls: type) -> tuple[tuple[tuple[str, ...], bytes], ...]:
    """(attribute path, the member's bytes as msgspec writes it while None) for each field the
    canonical encoding leaves out while None: `,"name":null` for a field of `cls` itself,
    `"name":null,` for one of a record nested in a field of `cls` (a transition's). msgspec
    writes that member; the first occurrence of its bytes in msgspec's output is the member
    itself, provided nothing written before it holds an untyped value (where a nested dict
    could have that key) or a record with a key of that name, and a nested one is not the
    last key of its record (no comma after it). The first key of `cls` itself is written
    `"name":null,` too (no comma before it)."""
    if not attrs.has(cls):
        return ()
    hints = typing.get_type_hints(cls)
    keys = sorted(field.name for field in attrs.fields(cls))
    members: list[tuple[tuple[str, ...], bytes]] = []
    for name in omitted_fields(cls):
        before = keys[: keys.index(name)]
        if any(_mentions_any(hints[key]) for key in before) or len(keys) == 1:
            raise TypeError(f"{cls.__name__}.{name} cannot be omitted on the fast path")
        # The first key has no comma before it (a plan's `grows`): the one after it goes.
        member = b',"%s":null' if before else b'"%s":null,'
        members.append(((name,), member % name.encode()))
    for position, key in enumerate(keys):
        inner = _record_type(hints[key])
        if inner is None or not omitted_fields(inner):
            continue
        earlier = keys[:position]
        taken = {name for other in earlier for name in _record_keys(hints[other])}
        inner_hints = typing.get_type_hints(inner)
        inner_keys = sorted(field.name for field in attrs.fields(inner))
        for name in omitted_fields(inner):
            at = inner_keys.index(name)
            if (
                at == len(inner_keys) - 1
                or name in taken
                or any(_mentions_any(hints[other]) for other in earlier)
                or any(_mentions_any(inner_hints[other]) for other in inner_keys[:at])
            ):
                raise TypeError(f"{inner.__name__}.{name} cannot be omitted on the fast path")
            members.append(((key, name), b'"%s":null,' % name.encode()))
    return tuple(members)


def _at(record: object, path: tuple[str, ...]) -> object:
    """The value at attribute `path` of `record` (None if a record on the way is None)."""
    value = record
    for name in path:
        value = getattr(value, name, None)
    return value


def _record_type(hint: Any) -> type | None:
    """The record class a field of type `hint` holds (`X` or `X | None`), if it holds one."""
    if attrs.has(hint):
        return typing.cast(type, hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        records = [arg for arg in typing.get_args(hint) if attrs.has(arg)]
        return records[0] if len(records) == 1 else None
    return None


def _record_keys(hint: Any) -> set[str]:
    """Every key a value of type `hint` can write, through nested records and containers."""
    found: set[str] = set()
    pending = [hint]
    seen: set[object] = set()
    while pending:
        item = pending.pop()
        if item in seen:
            continue
        seen.add(item)
        if attrs.has(item):
            inner = typing.get_type_hints(item)
            found.update(inner)
            pending.extend(inner.values())
        else:
            pending.extend(typing.get_args(item))
    return found


def decode_canonical(body: bytes, cls: type[T]) -> T | None:
    """The record of type `cls` that `body` encodes, if `body` is its canonical encoding;
    None when this path cannot tell (the strict path in `codec` then decides)."""
    return canonical_decoder(cls)(body)


_ANY_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(float_hook=_plain_float)


def decode_canonical_value(body: bytes) -> tuple[Any] | None:
    """(value,) for the canonical body of any JSON value (a blob), or None when unsure."""
    if may_hold_a_long_number(body):
        return None
    try:
        value = _ANY_DECODER.decode(body)
        again = _ENCODER.encode(value)
    except _UNSURE:
        return None
    return (value,) if again == body and not _deeper_than_allowed(body, value) else None


def _deeper_than_allowed(body: bytes, value: object) -> bool:
    """True if `value`, decoded from `body`, nests more than MAX_DEPTH containers: the
    strict path refuses it, so this one must not vouch for it. Each list or dict opens one
    bracket, so a body with few brackets needs no walk."""
    return body.count(b"[") + body.count(b"{") > MAX_DEPTH and too_deep(value, MAX_DEPTH)


def too_deep(value: object, limit: int) -> bool:
    """True if `value` nests more than `limit` containers: lists, tuples, dicts, records
    and views, each of which encodes as one JSON array or object. A loop, not recursion:
    it measures what would overflow the stack."""
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        kind = type(item)
        if kind is dict:
            children: Any = item.values()  # type: ignore[attr-defined]
        elif kind is list or kind is tuple:
            children = item
        elif isinstance(item, msgspec.Struct):
            children = msgspec.structs.astuple(item)
        elif attrs.has(kind):
            children = attrs.astuple(item, recurse=False)  # type: ignore[arg-type]
        else:
            continue
        if depth + 1 > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


# Views: msgspec Structs mirroring the attrs records, field for field.
_INT64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_VIEWS: dict[type, type] = {}


def canonical_view(cls: type[T]) -> Callable[[bytes], T | None]:
    """Like `canonical_decoder`, but what it returns for a canonical body is a read-only
    view of the record: a msgspec Struct with the same attributes (nested records are views
    too), not an instance of `cls`. It is typed as `cls` for the code that reads it by
    attribute, as fsck's chain checks do; nothing may isinstance-check, evolve or store it."""
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
        _view_of(cls), float_hook=_plain_float
    )
    encode = _ENCODER.encode
    omitted = _omitted_members(cls)
    untyped = _any_fields(cls)  # attribute paths to the values typed Any

    def decode(body: bytes) -> T | None:
        try:
            record: T = decoder.decode(body)
            again = encode(record)
        except _UNSURE:
            return None
        for path, member in omitted:
            if _at(record, path) is None:  # as in canonical_decoder
                again = again.replace(member, b"", 1)
        if again != body or _deeper_than_allowed(body, record):
            return None
        for path in untyped:
            value: Any = record
            for name in path:
                value = getattr(value, name, None)
            if not _fits_64_bits(value):
                return None
        return record

    return decode


def _fits_64_bits(value: Any) -> bool:
    """Every int in `value` is within the 64-bit data model. `value` is what a view holds
    where its record's type mentions Any: dicts and lists of scalars, tuples, and views of
    nested records (floats were vouched for by the float hook)."""
    pending = [value]  # a loop, not recursion: the value may nest deeply
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is int:
            if not -(2**63) <= item < 2**63:
                return False
        elif kind is dict:
            pending.extend(item.values())
        elif kind is list or kind is tuple:
            pending.extend(item)
        elif isinstance(item, msgspec.Struct):
            pending.extend(msgspec.structs.astuple(item))
    return True


def _view_of(cls: type) -> type:
    """The Struct mirroring attrs class `cls` (made once)."""
    try:
        return _VIEWS[cls]
    except KeyError:
        pass
    hints = typing.get_type_hints(cls)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for field in attrs.fields(cls):
        kind = _view_type(hints[field.name])
        if field.default is attrs.NOTHING:
            fields.append((field.name, kind))
        elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            factory = field.default.factory
            fields.append((field.name, kind, msgspec.field(default_factory=factory)))
        else:
            fields.append((field.name, kind, field.default))
    # A record whose only defaulted fields are v2 fields omitted while None (a snapshot)
    # omits them as the canonical encoding does; any other keeps writing its defaults.
    # A record that mixes both (a transition) writes them all: its omitted members are taken
    # out of the re-encoding by the record holding it (_omitted_members).
    defaulted = {field.name for field in attrs.fields(cls) if field.default is not attrs.NOTHING}
    omit = bool(defaulted) and defaulted == set(omitted_fields(cls))
    view = _VIEWS[cls] = msgspec.defstruct(
        f"{cls.__name__}View",
        fields,
        frozen=True,
        forbid_unknown_fields=True,
        gc=False,
        omit_defaults=omit,
    )
    return view


def _view_type(hint: Any) -> Any:
    """The type a view's field has for a record's field type `hint`."""
    if attrs.has(hint):
        return _view_of(hint)
    if hint is int:
        return _INT64
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return typing.Union[tuple(_view_type(arg) for arg in args)]  # noqa: UP007
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple[_view_type(args[0]), ...]  # type: ignore[misc]
    if origin is dict:
        return dict[_view_type(args[0]), _view_type(args[1])]  # type: ignore[misc]
    if origin is not None:
        raise TypeError(f"no view for the field type {hint!r}")  # a record type to add here
    return hint  # str, bool, an enum, Any


def _any_fields(cls: type) -> list[tuple[str, ...]]:
    """Attribute paths from a `cls` record to each value whose type mentions Any, through
    nested records (a value reached inside a container is checked as a whole)."""
    paths: list[tuple[str, ...]] = []
    for name, hint in typing.get_type_hints(cls).items():
        if attrs.has(hint):
            paths.extend((name, *path) for path in _any_fields(hint))
        elif _mentions_any(hint):
            paths.append((name,))
    return paths


def _mentions_any(hint: Any) -> bool:
    if hint is Any:
        return True
    if attrs.has(hint):
        return any(_mentions_any(inner) for inner in typing.get_type_hints(hint).values())
    return any(_mentions_any(arg) for arg in typing.get_args(hint))


class _PlanFacts(msgspec.Struct, frozen=True):
    """What the resume brief reads of a plan body: its steps are counted, never decoded."""

    name: str
    steps: list[msgspec.Raw]
    grows: bool | None = None


_PLAN_FACTS = msgspec.json.Decoder(_PlanFacts)


def plan_facts(body: bytes) -> tuple[str, int, bool] | None:
    """(name, number of steps, grows) of a plan body, or None if it is not that shape (the
    caller's strict path then decides). A 100,000-step plan takes 25 ms here, 500 as values."""
    try:
        facts = _PLAN_FACTS.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return facts.name, len(facts.steps), facts.grows is True
