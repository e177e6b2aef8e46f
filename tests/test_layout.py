"""Path arithmetic (castore.layout): task id names, object id validation, slot names."""

from __future__ import annotations

import os
import re
import unicodedata

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import castore
from castore import layout
from castore.layout import Layout, decode_task_id, encode_task_id, validate_object_id

NAME_SHAPE = re.compile(r"^[a-z0-9_%A-F-]+$")
NAME_MAX = 255  # bytes in one path component on ext4, xfs, btrfs, tmpfs
VALID_ID = "0123456789abcdef" * 4

# Any text, surrogates and control characters included: hostile ids come from anywhere.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=80)
LONG_TEXT = st.text(st.characters(min_codepoint=0x20), min_size=60, max_size=210)


def encoded_or_refused(task_id: str) -> str | None:
    """The name of `task_id`, or None if it is refused (with InvalidTaskIdError only)."""
    try:
        return encode_task_id(task_id)
    except castore.InvalidTaskIdError:
        return None


def assert_safe_name(name: str) -> None:
    assert NAME_SHAPE.match(name), name
    assert name not in (".", "..")
    assert "/" not in name
    assert "\x00" not in name
    assert not name.startswith(".")
    assert len(name.encode("utf-8")) <= NAME_MAX, f"{len(name.encode())} bytes"


# -- properties over arbitrary text -------------------------------------------------------------


@given(ANY_TEXT | LONG_TEXT)
def test_every_accepted_task_id_becomes_a_safe_name(task_id: str) -> None:
    """An accepted id maps to [a-z0-9_%A-F-]+, never '.', '..', '/', hidden or over 255 bytes."""
    name = encoded_or_refused(task_id)
    if name is not None:
        assert_safe_name(name)


@given(ANY_TEXT | LONG_TEXT)
def test_decode_of_encode_gives_back_the_task_id(task_id: str) -> None:
    """decode_task_id(encode_task_id(x)) == x for every accepted id."""
    name = encoded_or_refused(task_id)
    assume(name is not None)
    assert task_id == decode_task_id(name)


@given(ANY_TEXT, ANY_TEXT)
def test_distinct_task_ids_get_distinct_names_even_case_folded(first: str, second: str) -> None:
    """Two distinct ids never share a name, not even on a case-insensitive filesystem."""
    assume(first != second)
    names = (encoded_or_refused(first), encoded_or_refused(second))
    assume(None not in names)
    assert names[0] != names[1]
    assert names[0].lower() != names[1].lower()  # type: ignore[union-attr]


@given(st.text(st.characters(codec="ascii"), min_size=1, max_size=30))
def test_case_variants_get_names_distinct_after_lower(task_id: str) -> None:
    """An id and its upper/lower/swapped-case variants stay distinct after .lower()."""
    for variant in {task_id.lower(), task_id.upper(), task_id.swapcase()} - {task_id}:
        names = (encoded_or_refused(task_id), encoded_or_refused(variant))
        if None not in names:
            assert names[0].lower() != names[1].lower()  # type: ignore[union-attr]


@given(ANY_TEXT)
def test_encoding_either_succeeds_or_raises_invalid_task_id(task_id: str) -> None:
    """encode_task_id raises nothing but InvalidTaskIdError, and the error names the id."""
    try:
        encode_task_id(task_id)
    except castore.InvalidTaskIdError as exc:
        refused = exc
    else:
        return
    assert task_id == refused.task_id


@given(st.text(max_size=60))
def test_decode_refuses_or_round_trips_any_name(name: str) -> None:
    """decode_task_id of any string either refuses it or returns an id that encodes back to it."""
    try:
        task_id = decode_task_id(name)
    except castore.InvalidTaskIdError:
        return
    assert name == encode_task_id(task_id)


# -- explicit hostile ids ---------------------------------------------------------------------

ACCEPTED_HOSTILE = [
    "../../etc",
    "..",
    ".",
    "/",
    "a/../../b",
    ".snap",
    "CON",
    "NUL.txt",
    "invoice/42",
    "x" * 200,
    "." * 80,  # 240 bytes once escaped: long, but a name still fits
    "\\..\\..\\windows",
    "~root",
    "$HOME",
    " ",
    "a b",
]

REFUSED = [
    pytest.param("", id="empty"),
    pytest.param("a\x00b", id="NUL"),
    pytest.param("\x00", id="only-NUL"),
    pytest.param("a\nb", id="newline"),
    pytest.param("a\rb", id="carriage-return"),
    pytest.param("\x7f", id="DEL"),
    pytest.param("x" * 201, id="201-bytes"),
    pytest.param("\u00e9" * 101, id="202-utf8-bytes"),
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param("ok\udfff", id="lone-low-surrogate"),
    pytest.param(None, id="None"),
    pytest.param(b"invoice", id="bytes"),
    pytest.param(42, id="int"),
    pytest.param(["a"], id="list"),
]


@pytest.mark.parametrize("task_id", ACCEPTED_HOSTILE, ids=ascii)
def test_hostile_but_valid_ids_map_to_safe_reversible_names(task_id: str) -> None:
    """Path-like, hidden, reserved and long ids become safe names that decode back."""
    name = encode_task_id(task_id)
    assert_safe_name(name)
    assert task_id == decode_task_id(name)


@pytest.mark.parametrize("task_id", ACCEPTED_HOSTILE, ids=ascii)
def test_hostile_ids_stay_inside_the_tasks_directory(task_id: str) -> None:
    """The task directory of any accepted id is a direct child of <store>/tasks."""
    where = Layout("/srv/store")
    assert "/srv/store/tasks" == os.path.dirname(where.task_dir(task_id))
    assert os.path.normpath(where.task_dir(task_id)) == where.task_dir(task_id)


@pytest.mark.parametrize("task_id", REFUSED)
def test_invalid_task_ids_are_refused(task_id: object) -> None:
    """Empty, control characters, over 200 bytes, lone surrogates and non-str are refused."""
    with pytest.raises(castore.InvalidTaskIdError) as caught:
        encode_task_id(task_id)
    assert task_id == caught.value.task_id


@pytest.mark.parametrize("task_id", REFUSED)
def test_invalid_task_ids_never_become_paths(task_id: object) -> None:
    """Every Layout method that takes a task id refuses an invalid one."""
    where = Layout("/srv/store")
    for method in (where.task_dir, where.chain_dir, where.lock_path):
        with pytest.raises(castore.InvalidTaskIdError):
            method(task_id)  # type: ignore[arg-type]
    with pytest.raises(castore.InvalidTaskIdError):
        where.slot_path(task_id, 0)  # type: ignore[arg-type]


def test_known_names() -> None:
    """A few ids map to the names the format documents."""
    expected = {
        "invoice/42": "invoice%2F42",
        "..": "%2E%2E",
        ".snap": "%2Esnap",
        "CON": "%43%4F%4E",
        "a_b-c": "a_b-c",
        "%41": "%2541",
        "\u00e9": "%C3%A9",
    }
    assert expected == {task_id: encode_task_id(task_id) for task_id in expected}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("\u0456nvoice", "invoice", id="cyrillic-look-alike"),
        pytest.param(
            unicodedata.normalize("NFC", "\u00e9"),
            unicodedata.normalize("NFD", "\u00e9"),
            id="NFC-vs-NFD",
        ),
        pytest.param("%41", "A", id="escape-vs-letter"),
        pytest.param("A", "a", id="case"),
        pytest.param("invoice/42", "invoice%2F42", id="slash-vs-its-escape"),
        pytest.param("a.b", "a%2Eb", id="dot-vs-its-escape"),
        pytest.param("\ufb01", "fi", id="ligature"),
        pytest.param("\u212a", "K", id="kelvin-sign"),
    ],
)
def test_look_alike_ids_get_distinct_names(first: str, second: str) -> None:
    """Ids that look alike or normalise alike still get distinct names (also case-folded)."""
    assert first != second
    names = (encode_task_id(first), encode_task_id(second))
    assert names[0] != names[1]
    assert names[0].lower() != names[1].lower()


def test_the_longest_id_is_200_utf8_bytes_within_a_240_byte_name() -> None:
    """Ids up to 200 UTF-8 bytes are accepted if their escaped name fits 240 bytes."""
    encode_task_id("x" * 200)
    encode_task_id("\u20ac" * 26 + "x" * 6)  # 78 bytes escaped to 234 + 6 = 240
    with pytest.raises(castore.InvalidTaskIdError):
        encode_task_id("x" * 201)
    with pytest.raises(castore.InvalidTaskIdError):
        encode_task_id("\u20ac" * 27)  # 81 escaped bytes: a 243-byte name


@pytest.mark.parametrize(
    "task_id",
    [
        pytest.param("." * 200, id="200-dots"),
        pytest.param("/" * 200, id="200-slashes"),
        pytest.param("\u00e9" * 100, id="100-e-acute"),
        pytest.param("X" * 86, id="86-capitals"),
    ],
)
def test_an_accepted_id_whose_escapes_are_long_still_fits_a_file_name(task_id: str) -> None:
    """An id that is accepted never maps to a name longer than NAME_MAX (255 bytes)."""
    name = encoded_or_refused(task_id)
    if name is not None:
        assert len(name.encode()) <= NAME_MAX


# -- decode refuses names castore never writes --------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("%61", id="escaped-safe-letter"),
        pytest.param("%30", id="escaped-digit"),
        pytest.param("%2D", id="escaped-dash"),
        pytest.param("%5F", id="escaped-underscore"),
        pytest.param("invoice%2f42", id="lower-case-hex-escape"),
        pytest.param("%", id="lone-percent"),
        pytest.param("a%", id="trailing-percent"),
        pytest.param("a%2", id="short-escape"),
        pytest.param("%ZZ", id="non-hex-escape"),
        pytest.param("A", id="raw-upper-case"),
        pytest.param(".", id="dot"),
        pytest.param("..", id="dotdot"),
        pytest.param("a.b", id="raw-dot"),
        pytest.param("a/b", id="raw-slash"),
        pytest.param("", id="empty"),
        pytest.param("%C3", id="truncated-utf8"),
        pytest.param("%FF", id="invalid-utf8"),
        pytest.param("%ED%A0%80", id="encoded-surrogate"),
        pytest.param("%00", id="escaped-NUL"),
        pytest.param("%0A", id="escaped-newline"),
        pytest.param("\u00e9", id="raw-non-ascii"),
    ],
)
def test_decode_refuses_non_canonical_names(name: str) -> None:
    """decode_task_id refuses every name encode_task_id would never produce."""
    with pytest.raises(castore.InvalidTaskIdError):
        decode_task_id(name)


# -- object ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "object_id",
    [
        pytest.param(VALID_ID.upper(), id="upper-case"),
        pytest.param(VALID_ID[:-1] + "A", id="one-upper-case-digit"),
        pytest.param(VALID_ID[:63], id="63-chars"),
        pytest.param(VALID_ID + "0", id="65-chars"),
        pytest.param(VALID_ID[:63] + "g", id="non-hex"),
        pytest.param("../" + VALID_ID[3:], id="dotdot-slash"),
        pytest.param(VALID_ID[:32] + "/" + VALID_ID[33:], id="slash"),
        pytest.param(VALID_ID[:32] + "\x00" + VALID_ID[33:], id="NUL"),
        pytest.param(VALID_ID + "\n", id="trailing-newline"),
        pytest.param(" " + VALID_ID[1:], id="leading-space"),
        pytest.param("", id="empty"),
        pytest.param("\u0660" * 64, id="arabic-indic-digits"),
        pytest.param(None, id="None"),
        pytest.param(VALID_ID.encode(), id="bytes"),
        pytest.param(int(VALID_ID, 16), id="int"),
    ],
)
def test_invalid_object_ids_are_refused_before_becoming_paths(object_id: object) -> None:
    """Anything but 64 lowercase hex digits raises InvalidObjectIdError, also from Layout."""
    with pytest.raises(castore.InvalidObjectIdError) as caught:
        validate_object_id(object_id)
    assert object_id == caught.value.object_id
    where = Layout("/srv/store")
    with pytest.raises(castore.InvalidObjectIdError):
        where.object_path(object_id)  # type: ignore[arg-type]
    with pytest.raises(castore.InvalidObjectIdError):
        where.fanout_dir(object_id)  # type: ignore[arg-type]


@given(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))
def test_valid_object_ids_map_into_their_fanout_directory(object_id: str) -> None:
    """A valid id lives at objects/<first two digits>/<id>."""
    where = Layout("/srv/store")
    expected = f"/srv/store/objects/{object_id[:2]}/{object_id}"
    assert (object_id, expected) == (validate_object_id(object_id), where.object_path(object_id))


def test_invalid_object_id_error_is_a_usage_error() -> None:
    """InvalidObjectIdError can be caught as UsageError or ValueError."""
    with pytest.raises(castore.UsageError):
        validate_object_id("nope")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        validate_object_id("nope")


# -- slots and temp names -----------------------------------------------------------------------


@given(st.integers(0, layout.MAX_SEQ))
def test_slot_names_round_trip_and_sort_like_numbers(seq: int) -> None:
    """A slot name is 16 decimal digits that parse back to its sequence number."""
    name = layout.slot_name(seq)
    assert (16, seq) == (len(name), layout.parse_slot_name(name))


@pytest.mark.parametrize("seq", [-1, layout.MAX_SEQ + 1])
def test_slot_numbers_out_of_range_are_refused(seq: int) -> None:
    """A sequence number outside 0..MAX_SEQ has no slot name."""
    with pytest.raises(ValueError, match="out of range"):
        layout.slot_name(seq)


@pytest.mark.parametrize("name", ["1", "000000000000000a", "00000000000000001", ".tmp-x-1-0", ""])
def test_non_slot_names_parse_to_none(name: str) -> None:
    """Names that are not 16 decimal digits are not slots."""
    assert None is layout.parse_slot_name(name)


def test_temp_names_carry_host_and_pid_and_are_hidden() -> None:
    """A temp name starts with '.tmp-', parses back to this host's pid, and is not an object."""
    name = layout.temp_name()
    parsed = layout.parse_temp_name(name)
    assert parsed is not None
    assert (True, os.getpid(), False) == (
        name.startswith(layout.TMP_PREFIX),
        parsed[1],
        layout.is_object_name(name),
    )
