"""The canonical encoding (castore.format.codec): round trips, determinism, pinned ids, refusals."""

from __future__ import annotations

import collections
import enum
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import castore
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.plans import plan_bytes
from castore.format.records import (
    EffectRecord,
    EffectState,
    Frontier,
    Snapshot,
    Transition,
    TransitionKind,
    Writer,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
LEAVES = st.none() | st.booleans() | INT64 | FLOATS | st.text()
# Tuples encode as lists, so the model only has lists: a round trip gives back what went in.
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=25,
)


def typed(value: Any) -> Any:
    """`value` with every leaf tagged by its exact type, so True != 1 and 1 != 1.0."""
    if isinstance(value, list):
        return ["list", [typed(item) for item in value]]
    if isinstance(value, dict):
        return ["dict", sorted((key, typed(item)) for key, item in value.items())]
    if isinstance(value, float):
        return ["float", value.hex()]  # also tells 0.0 from -0.0
    return [type(value).__name__, value]


def reversed_dicts(value: Any) -> Any:
    """An equal value whose every dict was built in the reverse insertion order."""
    if isinstance(value, list):
        return [reversed_dicts(item) for item in value]
    if isinstance(value, dict):
        return {key: reversed_dicts(value[key]) for key in reversed(list(value))}
    return value


# -- round trip and determinism ---------------------------------------------------------------


@given(VALUES)
def test_decode_of_encode_gives_back_the_value_with_its_types(value: Any) -> None:
    """decode(encode(v)) equals v, leaf types included (bool stays bool, float stays float)."""
    assert typed(value) == typed(codec.decode_value(codec.encode_value(value)))


@given(VALUES)
def test_encoding_is_a_fixed_point(value: Any) -> None:
    """Encoding the decoded bytes again gives the very same bytes."""
    data = codec.encode_value(value)
    assert data == codec.encode_value(codec.decode_value(data))


@given(VALUES)
def test_same_value_gives_same_bytes_whatever_the_dict_insertion_order(value: Any) -> None:
    """Dicts built in different insertion orders encode to identical bytes."""
    assert codec.encode_value(value) == codec.encode_value(reversed_dicts(value))


@given(st.lists(VALUES, max_size=5))
def test_tuples_encode_as_lists(items: list[Any]) -> None:
    """A tuple encodes to the same bytes as the list of its items."""
    assert codec.encode_value(items) == codec.encode_value(tuple(items))


@given(st.dictionaries(st.text(), st.integers(0, 9), min_size=2, max_size=8))
def test_keys_are_sorted_by_code_point(value: dict[str, int]) -> None:
    """Object keys appear in code point order in the encoded bytes."""
    decoded_order = list(codec.decode_value(codec.encode_value(value)))
    assert sorted(value) == decoded_order


JSON_DEFINITION = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
# Every code point but the surrogates, and floats on both sides of the exponent boundaries.
ANY_CHAR = st.characters(blacklist_categories=("Cs",))
TEXTS = st.text(ANY_CHAR)
EDGE_FLOATS = st.sampled_from([1e16, 9999999999999998.0, 1e-4, 9.999e-5, 5e-324, -0.0, 1e308])
WIDE_VALUES = st.recursive(
    st.none() | st.booleans() | INT64 | FLOATS | EDGE_FLOATS | TEXTS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXTS, inner, max_size=5),
    max_leaves=25,
)


@given(WIDE_VALUES)
def test_the_c_encoder_writes_exactly_the_json_definition(value: Any) -> None:
    """encode_value writes through msgspec unless a float needs json's exponent text: either
    way the bytes are the ones json.dumps with the canonical options writes (its definition)."""
    assert codec.encode_value(value) == JSON_DEFINITION.encode(value).encode("utf-8")


def test_floats_with_an_exponent_keep_json_text() -> None:
    """msgspec writes 1e16 where the canonical text (Python's repr) is 1e+16."""
    assert codec.encode_value([1e16, 1e-05, 0.5]) == b"[1e+16,1e-05,0.5]"


def test_encoding_is_compact_utf8_json() -> None:
    """The bytes of a fixed value are compact JSON with raw UTF-8 and sorted keys."""
    value = {"z": [1, -2, 3.5, None, True, False], "a": "h\u00e9llo \u2603", "e": [], "d": {}}
    expected = '{"a":"h\u00e9llo \u2603","d":{},"e":[],"z":[1,-2,3.5,null,true,false]}'
    assert expected.encode("utf-8") == codec.encode_value(value)


# -- pinned ids: a change of encoding must be a deliberate, visible format change -------------

PINNED_VALUE = {
    "z": [1, -2, 3.5, None, True, False],
    "a": "h\u00e9llo \u2603",
    "n": {"k": -(2**63), "m": 2**63 - 1},
    "e": [],
    "d": {},
}


def test_blob_id_of_a_fixed_value_is_pinned() -> None:
    """The object id of a fixed blob value never changes."""
    data = codec.frame("blob", codec.encode_value(PINNED_VALUE))
    assert "321b97011093041848fa0dd2b4b737293adbcedb07655b3974255e837354c67b" == hash_bytes(data)


def test_plan_id_of_a_fixed_plan_is_pinned() -> None:
    """The plan digest of a fixed plan never changes (record schema and frame included)."""
    plan = castore.Plan.build("demo", "fetch", "summarize", "publish")
    expected_bytes = (
        b'castore 1 plan 182\n{"meta":{},"name":"demo","steps":[{"after":[],"effect":false,'
        b'"id":"fetch"},{"after":["fetch"],"effect":false,"id":"summarize"},{"after":'
        b'["summarize"],"effect":false,"id":"publish"}]}'
    )
    assert expected_bytes == plan_bytes(plan)
    assert "070bc8c07f0576a1eaf6b336e401e93259281988a34aeaf196012f6e80d73f59" == castore.plan_id(
        plan
    )


def _fixed_snapshot() -> Snapshot:
    return Snapshot(
        task="invoice/42",
        seq=1,
        parent="0" * 64,
        plan="1" * 64,
        frontier=Frontier(1, "summarize"),
        effects=(EffectRecord("pay", "cas-k", EffectState.SUBMITTED, 5, attempts=1),),
        transition=Transition(TransitionKind.STEP, step="fetch", result={"n": 1}),
        env="e",
        time_ms=1_700_000_000_000,
        writer=Writer("host", 7, "0123456789abcdef"),
    )


def test_snapshot_id_of_a_fixed_snapshot_is_pinned() -> None:
    """The object id of a fixed snapshot record never changes."""
    data = codec.encode_record("snapshot", _fixed_snapshot())
    assert "4358b23bf6c7eefcbd5576cab6b72d3db8e95152f34dbc614dcb7abe48e61b42" == hash_bytes(data)


def test_snapshot_record_round_trips() -> None:
    """A snapshot record decodes back to an equal record."""
    snapshot = _fixed_snapshot()
    kind, body = codec.unframe(codec.encode_record("snapshot", snapshot))
    assert ("snapshot", snapshot) == (kind, codec.from_builtins(codec.decode_value(body), Snapshot))


# -- refusals ---------------------------------------------------------------------------------


class Colour(enum.IntEnum):
    RED = 1


class Name(enum.StrEnum):
    ALICE = "alice"


class Custom:
    pass


REFUSED = [
    pytest.param(math.nan, id="nan"),
    pytest.param(math.inf, id="inf"),
    pytest.param(-math.inf, id="-inf"),
    pytest.param(2**63, id="int-too-big"),
    pytest.param(-(2**63) - 1, id="int-too-small"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param(bytearray(b"x"), id="bytearray"),
    pytest.param({1, 2}, id="set"),
    pytest.param(frozenset(), id="frozenset"),
    pytest.param(Custom(), id="custom-object"),
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param("ok \udfff", id="lone-low-surrogate"),
    pytest.param(Colour.RED, id="IntEnum"),
    pytest.param(Name.ALICE, id="StrEnum"),
    pytest.param(collections.OrderedDict(a=1), id="dict-subclass"),
    pytest.param(collections.namedtuple("Pair", "a b")(1, 2), id="tuple-subclass"),
    pytest.param(complex(1, 2), id="complex"),
]


@pytest.mark.parametrize("bad", REFUSED)
def test_values_outside_the_data_model_are_refused(bad: object) -> None:
    """A value outside the data model raises EncodingError naming the root path '$'."""
    with pytest.raises(castore.EncodingError) as caught:
        codec.encode_value(bad)
    assert "$" == caught.value.path
    assert "$" in str(caught.value)


@pytest.mark.parametrize("bad", REFUSED)
def test_refusal_names_the_path_of_a_nested_bad_value(bad: object) -> None:
    """A bad value deep inside lists and dicts is named by its full path."""
    value = {"a": [0, {"b": [1, 2, bad]}]}
    with pytest.raises(castore.EncodingError) as caught:
        codec.encode_value(value)
    assert "$.a[1].b[2]" == caught.value.path
    assert "$.a[1].b[2]" in str(caught.value)


@st.composite
def bad_value_at_a_path(draw: st.DrawFn) -> tuple[Any, str]:
    """(value, path): one value outside the model buried at a random path among good ones."""
    bad = draw(st.sampled_from([math.nan, math.inf, 2**64, b"x", {1}, "\udc80", Colour.RED]))
    steps = draw(st.lists(st.text(max_size=3) | st.integers(0, 3), max_size=5))
    value: Any = bad
    for step in reversed(steps):
        if isinstance(step, int):
            value = [*draw(st.lists(LEAVES, min_size=step, max_size=step)), value]
        else:
            value = {step: value}
    path = "$" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps)
    return value, path


@given(bad_value_at_a_path())
def test_refusal_path_is_where_the_bad_value_is(case: tuple[Any, str]) -> None:
    """EncodingError.path is the path of the one bad value, wherever it is buried."""
    value, path = case
    with pytest.raises(castore.EncodingError) as caught:
        codec.encode_value(value)
    assert path == caught.value.path


@pytest.mark.parametrize(
    "key", [1, 1.5, None, True, ("a",), b"k", Name.ALICE], ids=lambda k: type(k).__name__
)
def test_non_str_dict_keys_are_refused(key: object) -> None:
    """A dict key that is not exactly a str raises EncodingError naming the dict's path."""
    with pytest.raises(castore.EncodingError) as caught:
        codec.encode_value({"outer": {key: 1}})
    assert "$.outer" == caught.value.path


def test_lone_surrogate_in_a_dict_key_is_refused() -> None:
    """A dict key with a lone surrogate raises EncodingError naming (at least) the dict."""
    with pytest.raises(castore.EncodingError) as caught:
        codec.encode_value({"outer": {"\ud83d": 1}})
    assert caught.value.path.startswith("$.outer")


def test_encoding_error_is_a_usage_error_and_a_value_error() -> None:
    """EncodingError can be caught as UsageError or ValueError."""
    with pytest.raises(castore.UsageError):
        codec.encode_value(math.nan)
    with pytest.raises(ValueError, match="finite"):
        codec.encode_value(math.nan)


@pytest.mark.parametrize(
    "data",
    [b"NaN", b"[Infinity]", b"-Infinity", b"1e999", b"9223372036854775808", b'{"a":1,"a":2}'],
)
def test_decode_never_returns_a_value_outside_the_data_model(data: bytes) -> None:
    """Bytes that would decode to NaN, infinities, >64-bit ints or duplicate keys are refused."""
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError (EncodingError is one)
        codec.decode_value(data)


# -- frames -----------------------------------------------------------------------------------


@given(st.sampled_from(codec.KINDS), st.binary(max_size=300))
def test_unframe_of_frame_gives_back_kind_and_body(kind: str, body: bytes) -> None:
    """unframe(frame(kind, body)) == (kind, body), for any body bytes."""
    assert (kind, body) == codec.unframe(codec.frame(kind, body))


def test_frame_header_is_one_line() -> None:
    """The header is 'castore <version> <kind> <length>\\n'."""
    assert b"castore 1 blob 3\nabc" == codec.frame("blob", b"abc")


def test_frame_refuses_an_unknown_kind() -> None:
    """frame() refuses a kind the format does not have."""
    with pytest.raises(ValueError, match="widget"):
        codec.frame("widget", b"")


@pytest.mark.parametrize(
    ("kind", "version", "header"),
    [
        pytest.param("plan", None, b"castore 1 plan 0\n", id="plan-v1"),
        pytest.param("snapshot", None, b"castore 1 snapshot 0\n", id="snapshot-v1"),
        pytest.param("snapshot", 2, b"castore 2 snapshot 0\n", id="snapshot-with-v2-fields"),
        pytest.param("blob", None, b"castore 1 blob 0\n", id="blob-v1"),
        pytest.param("raw", None, b"castore 2 raw 0\n", id="raw"),
        pytest.param("tree", None, b"castore 2 tree 0\n", id="tree"),
        pytest.param("pack", None, b"castore 2 pack 0\n", id="pack"),
    ],
)
def test_the_header_names_the_lowest_version_that_reads_the_object(
    kind: str, version: int | None, header: bytes
) -> None:
    """A v1 record keeps its v1 bytes (and id) in a v2 store; v2-only kinds say version 2."""
    framed = codec.frame(kind, b"", version)
    assert header == framed
    assert (kind, b"") == codec.unframe(framed)
    assert b"" == codec.intact_body(framed, kind)


@pytest.mark.parametrize("kind", ["raw", "tree", "pack"])
def test_a_v2_only_kind_cannot_carry_a_v1_header(kind: str) -> None:
    """Neither framed nor read: a v1 header on a pack is malformed, not an old pack."""
    with pytest.raises(ValueError, match="version 1"):
        codec.frame(kind, b"", 1)
    data = b"castore 1 %s 0\n" % kind.encode()
    with pytest.raises(codec.FrameError) as caught:
        codec.unframe(data)
    assert "bad-header" == caught.value.code
    assert codec.intact_body(data, kind) is None


@pytest.mark.parametrize(
    ("data", "code"),
    [
        pytest.param(b"", "empty", id="empty"),
        pytest.param(b"castore 1 blob 3", "bad-header", id="no-newline"),
        pytest.param(b"castore 1 blob 3abc", "bad-header", id="no-newline-with-body"),
        pytest.param(b"castore 1 blob " + b"0" * 60 + b"\n", "bad-header", id="header-too-long"),
        pytest.param(b"castorf 1 blob 0\n", "bad-header", id="bad-magic"),
        pytest.param(b"CASTORE 1 blob 0\n", "bad-header", id="magic-upper-case"),
        pytest.param(b"castore 1 blob\n", "bad-header", id="three-fields"),
        pytest.param(b"castore 1 blob 0 x\n", "bad-header", id="five-fields"),
        pytest.param(b"castore  1 blob 0\n", "bad-header", id="double-space"),
        pytest.param(b"castore 1 blob -1\n", "bad-header", id="negative-length"),
        pytest.param(b"castore 1 blob x\n", "bad-header", id="non-digit-length"),
        pytest.param(b"castore x blob 0\n", "bad-header", id="non-digit-version"),
        pytest.param(b"castore 1 widget 0\n", "unknown-kind", id="unknown-kind"),
        pytest.param(b"castore 1 Blob 0\n", "unknown-kind", id="kind-upper-case"),
        pytest.param(b"castore 1 blob 5\nabc", "truncated", id="truncated-body"),
        pytest.param(b"castore 1 blob 2\nabc", "truncated", id="trailing-bytes"),
        pytest.param(b"\x00" * 32, "bad-header", id="zeros"),
    ],
)
def test_malformed_frames_are_refused(data: bytes, code: str) -> None:
    """Each malformed header or length mismatch raises FrameError with its code."""
    with pytest.raises(codec.FrameError) as caught:
        codec.unframe(data)
    assert code == caught.value.code


def test_trailing_bytes_are_reported_as_such() -> None:
    """A body longer than its header says is reported as trailing bytes, not truncation."""
    with pytest.raises(codec.FrameError, match="trailing"):
        codec.unframe(b"castore 1 blob 2\nabc")


@pytest.mark.parametrize("version", [0, 3, 99, 10**30])
def test_unknown_format_versions_are_refused(version: int) -> None:
    """A frame of a format version this reader does not know raises FormatVersionError."""
    data = b"castore %d blob 0\n" % version
    with pytest.raises(castore.FormatVersionError) as caught:
        codec.unframe(data, "objects/ab/x")
    assert (version, "objects/ab/x") == (caught.value.found, caught.value.path)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"castore 01 blob 0\n", id="version-leading-zero"),
        pytest.param(b"castore 1 blob 03\nabc", id="length-leading-zero"),
    ],
)
def test_unframe_accepts_only_canonical_headers(data: bytes) -> None:
    """A header frame() never writes (leading zeros) is refused: one value, one byte string."""
    with pytest.raises((codec.FrameError, castore.FormatVersionError)):
        codec.unframe(data)


@st.composite
def header_like(draw: st.DrawFn) -> bytes:
    """Frames that are nearly right: version and length may carry leading zeros or be off."""
    body = draw(st.binary(max_size=12))
    version = draw(st.sampled_from([b"1", b"01", b"001", b"2"]))
    kind = draw(st.sampled_from([k.encode() for k in codec.KINDS]))
    length = b"0" * draw(st.integers(0, 2)) + b"%d" % (len(body) + draw(st.integers(-1, 1)))
    return b"castore %s %s %s\n%s" % (version, kind, length, body)


@given(st.binary(max_size=80) | header_like())
def test_whatever_unframe_accepts_reframes_to_the_same_bytes(data: bytes) -> None:
    """Any bytes unframe() accepts are exactly frame() of what it returned, at the version
    its header names."""
    try:
        kind, body = codec.unframe(data)
    except (codec.FrameError, castore.FormatVersionError):
        return
    assert data == codec.frame(kind, body, int(data.split(b" ")[1]))
