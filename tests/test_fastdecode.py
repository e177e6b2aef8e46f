"""fsck's fast decoding path (castore.format.fastdecode) never accepts what the strict path refuses.

The contract: `decode_canonical` answers "valid, here is the record" or "not sure" (None).
Whenever it answers, the strict path (codec.decode_value + canonical re-encoding + cattrs)
must accept the same bytes and give an equal record of the same types.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from castore.errors import EncodingError
from castore.format import codec
from castore.format.fastdecode import (
    canonical_view,
    decode_canonical,
    decode_canonical_value,
    may_hold_a_long_number,
)
from castore.format.records import (
    EffectRecord,
    EffectState,
    Frontier,
    Plan,
    Snapshot,
    Step,
    Transition,
    TransitionKind,
    Writer,
)

INTS = st.integers(min_value=-(2**65), max_value=2**65)  # also beyond the 64-bit model
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
LEAVES = st.none() | st.booleans() | INTS | FLOATS | st.text()
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def strict_record(body: bytes, cls: type[Any] | None) -> Any:
    """What the strict path makes of `body`; raises if it refuses it."""
    value = codec.decode_value_strict(body)
    if codec.encode_value(value) != body:
        raise ValueError("not canonical")
    return value if cls is None else codec.from_builtins(value, cls)


def typed(value: Any) -> Any:
    """`value` with every leaf tagged by its exact type (True != 1, 1 != 1.0, 0.0 != -0.0)."""
    if isinstance(value, list | tuple):
        return [type(value).__name__, [typed(item) for item in value]]
    if isinstance(value, dict):
        return ["dict", sorted((key, typed(item)) for key, item in value.items())]
    if isinstance(value, float):
        return ["float", value.hex()]
    return [type(value).__name__, value]


def assert_agrees(body: bytes, cls: type[Any] | None) -> Any:
    """The fast answer for `body`, after checking the strict path accepts it alike."""
    fast = decode_canonical_value(body) if cls is None else decode_canonical(body, cls)
    if fast is None:
        return None
    fast_value = fast[0] if cls is None else fast
    strict = strict_record(body, cls)  # raises: the fast path accepted what it must not
    assert strict == fast_value
    if cls is None:
        assert typed(strict) == typed(fast_value)
    return fast_value


def snapshot(**changes: Any) -> Snapshot:
    fields: dict[str, Any] = {
        "task": "invoice/42",
        "seq": 3,
        "parent": "ab" * 32,  # ("0" * 64 is a long digit run: the strict path would decide)
        "plan": "cd" * 32,
        "frontier": Frontier(3, "pay"),
        "effects": (EffectRecord("pay", "cas-k", EffectState.SUBMITTED, 5, attempts=1),),
        "transition": Transition(TransitionKind.EFFECT, step="pay", result={"n": 1.5}),
        "env": None,
        "time_ms": 1_700_000_000_000,
        "writer": Writer("host", 7, "0123456789abcdef"),
    }
    fields.update(changes)
    return Snapshot(**fields)


def body_of(record: object) -> bytes:
    return codec.unframe(codec.encode_record("snapshot", record))[1]


def test_a_canonical_snapshot_takes_the_fast_path_with_equal_typed_fields() -> None:
    record = snapshot()
    fast = assert_agrees(body_of(record), Snapshot)
    assert record == fast
    assert type(fast.effects) is tuple
    assert type(fast.transition.kind) is TransitionKind
    assert type(fast.effects[0].state) is EffectState


def test_a_canonical_plan_takes_the_fast_path() -> None:
    plan = Plan.build("p", "a", Step("b", effect=True, after=("a",)), owner="me")
    body = codec.unframe(codec.encode_record("plan", plan))[1]
    assert plan == assert_agrees(body, Plan)


@given(VALUES)
def test_any_canonical_value_is_accepted_alike_or_left_to_the_strict_path(value: Any) -> None:
    try:
        body = codec.encode_value(value)
    except EncodingError:
        return  # outside the data model (an int beyond 64 bits): nothing canonical to read
    assert_agrees(body, None)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_are_never_accepted_unless_the_strict_path_accepts(body: bytes) -> None:
    assert_agrees(body, None)


@given(st.data())
def test_mutated_snapshot_bodies_are_never_wrongly_accepted(data: st.DataObject) -> None:
    """Replace a slice of a valid body with JSON-ish text: whatever the fast path accepts,
    the strict path accepts too, with an equal record."""
    body = body_of(snapshot())
    start = data.draw(st.integers(0, len(body)))
    end = data.draw(st.integers(start, min(len(body), start + 12)))
    filler = data.draw(
        st.text(alphabet='0123456789-+.eE"{}[],:nultrfase \\', max_size=12)
        | st.sampled_from(["9223372036854775808", "1e16", "1e+16", ' "seq":3', '"extra":1,'])
    )
    assert_agrees(body[:start] + filler.encode() + body[end:], Snapshot)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"x":1e16}', "msgspec's exponent form, not the canonical 1e+16"),
        (b'{"x":1e+16}', "canonical, but an exponent float: left to the strict path"),
        (b'{"x":0.00001}', "Python writes 1e-05"),
        (b'{"x":9223372036854775808}', "one past the 64-bit model"),
        (b'{"x":18446744073709551615}', "the largest uint64, which msgspec reads"),
        (b'{"a":1,"a":1}', "a duplicate key"),
        (b'{"b":1,"a":2}', "keys out of order"),
        (b'{"a": 1}', "whitespace"),
        (b'"\\u00e9"', "an escape where canonical JSON has the raw character"),
        (b'"\\ud800"', "a lone surrogate"),
        (b"1e999", "infinity"),
    ],
)
def test_bodies_the_fast_path_must_leave_to_the_strict_path(body: bytes, why: str) -> None:
    assert decode_canonical_value(body) is None, why


@given(VALUES)
def test_decode_value_with_its_fast_path_gives_what_the_strict_decoder_gives(value: Any) -> None:
    try:
        body = codec.encode_value(value)
    except EncodingError:
        return
    assert typed(codec.decode_value_strict(body)) == typed(codec.decode_value(body))


def test_snapshot_bodies_the_fast_path_must_leave_to_the_strict_path() -> None:
    body = body_of(snapshot())
    extra = body.replace(b'"env":null', b'"env":null,"extra":1')
    missing_default = body.replace(b'"attempts":1,', b"")
    wide = body.replace(b'"seq":3', b'"seq":9223372036854775808')
    boolean = body.replace(b'"seq":3', b'"seq":true')
    for bad in (extra, missing_default, wide, boolean):
        assert bad != body
        assert decode_canonical(bad, Snapshot) is None
    with pytest.raises((ValueError, codec.SchemaError)):
        strict_record(extra, Snapshot)
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        strict_record(wide, Snapshot)


# Views (canonical_view): msgspec Structs that mirror the records, for fsck's hot loop.


def assert_view_agrees(body: bytes, cls: type[Any]) -> Any:
    """The view of `body`, after checking the strict path accepts it with equal fields."""
    view = canonical_view(cls)(body)
    if view is not None:
        assert_same_fields(view, strict_record(body, cls))
    return view


def assert_same_fields(view: Any, record: Any) -> None:
    """`view` has every field of the attrs `record`, equal and of the same exact type."""
    if attrs.has(type(record)):
        for field in attrs.fields(type(record)):
            assert_same_fields(getattr(view, field.name), getattr(record, field.name))
    elif isinstance(record, tuple):
        assert type(view) is tuple
        assert len(view) == len(record)
        for item_view, item in zip(view, record, strict=True):
            assert_same_fields(item_view, item)
    else:
        assert typed(view) == typed(record)


def test_a_canonical_snapshot_has_a_view_with_the_same_fields() -> None:
    record = snapshot()
    view = assert_view_agrees(body_of(record), Snapshot)
    assert view is not None
    assert type(view.transition.kind) is TransitionKind
    assert type(view.effects[0].state) is EffectState
    assert view.effects[0].attempts == 1


@given(st.data())
def test_mutated_snapshot_bodies_never_get_a_view_the_strict_path_refuses(
    data: st.DataObject,
) -> None:
    body = body_of(snapshot())
    start = data.draw(st.integers(0, len(body)))
    end = data.draw(st.integers(start, min(len(body), start + 12)))
    filler = data.draw(
        st.text(alphabet='0123456789-+.eE"{}[],:nultrfase \\', max_size=12)
        | st.sampled_from(["9223372036854775808", "-9223372036854775809", "1e16", "true"])
    )
    assert_view_agrees(body[:start] + filler.encode() + body[end:], Snapshot)


@given(VALUES)
def test_any_result_value_gets_a_view_only_if_the_strict_path_agrees(value: Any) -> None:
    record = snapshot(transition=Transition(TransitionKind.STEP, step="pay", result=value))
    try:
        body = body_of(record)
    except EncodingError:  # an int beyond 64 bits: spliced in as canonical JSON would write it
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        body = body_of(snapshot()).replace(b'{"n":1.5}', text.encode(), 1)
        assert assert_view_agrees(body, Snapshot) is None
        return
    assert_view_agrees(body, Snapshot)


@pytest.mark.parametrize(
    ("number", "fits"),
    [(2**63 - 1, True), (2**63, False), (-(2**63), True), (-(2**63) - 1, False), (2**64, False)],
)
def test_ints_at_the_64_bit_edges_in_typed_fields_and_in_results(number: int, fits: bool) -> None:
    base = body_of(snapshot())
    in_seq = base.replace(b'"seq":3', b'"seq":%d' % number)
    in_time = base.replace(b'"time_ms":1700000000000', b'"time_ms":%d' % number)
    nested = base.replace(b'{"n":1.5}', b'{"n":[1,{"m":%d}]}' % number)
    for body in (in_seq, in_time, nested):
        assert body != base
        view = assert_view_agrees(body, Snapshot)
        assert (view is not None) == fits, body


@pytest.mark.parametrize(
    ("body", "long"),
    [
        (b'{"n":12345678901234567890}', True),
        (b'{"n":[1,-1234567890123456789]}', True),
        (b"1234567890123456789", True),  # a bare number: the body's first bytes
        (b'{"n":1.1234567890123456789}', True),  # after a point: maybe not, but unsure
        (b'{"n":123456789012345678}', False),  # 18 digits: always a 64-bit int
        (b'{"id":"f1234567890123456789012ab"}', False),  # digits after a letter: in a string
        (b'{"id":"1234567890123456789012ab"}', False),  # after a quote: in a string
        (b'{"t":"order 1234567890123456789"}', True),  # after a space in a string: unsure
        (b'{"t":"\xc3\xa91234567890123456789"}', True),  # after a non-ASCII byte: unsure
    ],
)
def test_only_a_digit_run_that_may_be_a_number_sends_a_body_to_the_strict_path(
    body: bytes, long: bool
) -> None:
    assert may_hold_a_long_number(body) is long


def test_a_hex_id_holding_nineteen_digits_in_a_row_takes_the_fast_path() -> None:
    parent = "1234567890123456789012" + "ab" * 21
    record = snapshot(parent=parent, plan="c" + "9" * 40 + "d" * 23)
    body = body_of(record)
    assert b"1234567890123456789" in body
    assert b"9" * 40 in body
    assert assert_agrees(body, Snapshot) == record


@attrs.frozen
class _Inner:
    value: Any


@attrs.frozen
class _Outer:
    items: tuple[_Inner, ...]
    maybe: _Inner | None = None


@pytest.mark.parametrize(
    "body",
    [
        b'{"items":[{"value":9223372036854775808}],"maybe":null}',
        b'{"items":[],"maybe":{"value":[9223372036854775808]}}',
    ],
)
def test_an_any_field_inside_a_tuple_or_an_optional_record_is_bounded_too(body: bytes) -> None:
    """No castore record has this shape today; the view must stay right if one does."""
    assert canonical_view(_Outer)(body) is None
    fits = body.replace(b"9223372036854775808", b"9223372036854775807")
    assert canonical_view(_Outer)(fits) is not None
    with pytest.raises(ValueError, match="64 bits"):
        strict_record(body, _Outer)
