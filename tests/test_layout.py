"""Path arithmetic (castore.format.layout): task id names, object id validation, slot names."""

from __future__ import annotations

import contextlib
import os
import re
import unicodedata

import pytest
from helpers import cli, tree_snapshot
from hypothesis import assume, given
from hypothesis import strategies as st

import castore
from castore.cli.watch import alert_line
from castore.format import layout
from castore.format.layout import Layout, decode_task_id, encode_task_id, validate_object_id
from castore.watch.alerts import Alert

NAME_SHAPE = re.compile(r"^[a-z0-9_%A-F-]+$")
NAME_MAX = 255  # bytes in one path component on ext4, xfs, btrfs, tmpfs
VALID_ID = "0123456789abcdef" * 4

# Any text, surrogates and control characters included: hostile ids come from anywhere.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=80)
# Text of printable characters (what str.isprintable accepts), most of it valid once NFC.
_PRINTABLE = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
PRINTABLE_TEXT = st.text(_PRINTABLE | st.just(" "), min_size=1, max_size=60).map(
    lambda text: unicodedata.normalize("NFC", text)
)
LONG_TEXT = st.text(_PRINTABLE, min_size=60, max_size=210)


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


@given(PRINTABLE_TEXT | ANY_TEXT | LONG_TEXT)
def test_every_accepted_task_id_becomes_a_safe_name(task_id: str) -> None:
    """An accepted id maps to [a-z0-9_%A-F-]+, never '.', '..', '/', hidden or over 255 bytes."""
    name = encoded_or_refused(task_id)
    if name is not None:
        assert_safe_name(name)


@given(PRINTABLE_TEXT | ANY_TEXT | LONG_TEXT)
def test_decode_of_encode_gives_back_the_task_id(task_id: str) -> None:
    """decode_task_id(encode_task_id(x)) == x for every accepted id."""
    name = encoded_or_refused(task_id)
    assume(name is not None)
    assert task_id == decode_task_id(name)


@given(PRINTABLE_TEXT | ANY_TEXT, PRINTABLE_TEXT | ANY_TEXT)
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
    "\u8acb\u6c42\u66f8/2026-11",  # CJK
    "caf\u00e9",  # accented, NFC
    "\u00c5ngstr\u00f6m",  # NFC (the Angstrom sign U+212B is not)
    "\U0001f680 launch",  # an emoji
    "\u0939\u093f\u0928\u094d\u0926\u0940",  # Devanagari with combining signs, NFC
    "\ufb01le",  # a ligature: NFC keeps it (only NFKC would not)
    "\u0301",  # a lone combining accent is NFC and printable
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
    pytest.param("a\tb", id="TAB"),
    pytest.param("a\x1b[2Jb", id="ESC"),
    pytest.param("a\x7fb", id="DEL-inside"),
    pytest.param("job\x851", id="U+0085-next-line"),
    pytest.param("job\u20281", id="U+2028-line-separator"),
    pytest.param("job\u20291", id="U+2029-paragraph-separator"),
    pytest.param("invoice-\u202e24-txt", id="U+202E-right-to-left-override"),
    pytest.param("in\u200bvoice", id="U+200B-zero-width-space"),
    pytest.param("\ufeffinvoice", id="U+FEFF-byte-order-mark"),
    pytest.param("in\u00advoice", id="U+00AD-soft-hyphen"),
    pytest.param("\u2066x\u2069", id="U+2066-bidi-isolate"),
    pytest.param("a\u200db", id="U+200D-zero-width-joiner"),
    pytest.param("a\U000e0041b", id="U+E0041-tag-character"),
    pytest.param("a\u00a0b", id="U+00A0-no-break-space"),
    pytest.param("a\u3000b", id="U+3000-ideographic-space"),
    pytest.param("a\u2009b", id="U+2009-thin-space"),
    pytest.param("a\ue000b", id="U+E000-private-use"),
    pytest.param("a\U0010fffdb", id="U+10FFFD-private-use-plane-16"),
    pytest.param("a\u0378b", id="U+0378-unassigned"),
    pytest.param("a\uffffb", id="U+FFFF-noncharacter"),
    pytest.param("cafe\u0301", id="NFD-e-acute"),
    pytest.param("\u212a", id="kelvin-sign-NFC-is-K"),
    pytest.param("\u212bngstr\u00f6m", id="angstrom-sign-NFC-is-A-ring"),
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
    """Empty, unprintable (control, format, separator, private-use, unassigned, surrogate),
    not NFC, over 200 bytes and non-str ids are refused."""
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
        pytest.param("%41", "A", id="escape-vs-letter"),
        pytest.param("A", "a", id="case"),
        pytest.param("invoice/42", "invoice%2F42", id="slash-vs-its-escape"),
        pytest.param("a.b", "a%2Eb", id="dot-vs-its-escape"),
        pytest.param("\ufb01", "fi", id="ligature"),
    ],
)
def test_look_alike_ids_get_distinct_names(first: str, second: str) -> None:
    """Valid ids that look alike or NFKC-normalise alike still get distinct names (also
    case-folded); spellings that only NFC tells apart cannot both be valid (see below)."""
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


# -- printable, NFC ids: one visible name is one task ----------------------------------------


@given(PRINTABLE_TEXT | ANY_TEXT | LONG_TEXT)
def test_an_accepted_id_is_printable_and_nfc(task_id: str) -> None:
    """Every accepted id prints as itself (repr escapes nothing) and is its own NFC form."""
    assume(encoded_or_refused(task_id) is not None)
    assert (True, task_id) == (task_id.isprintable(), unicodedata.normalize("NFC", task_id))


@given(PRINTABLE_TEXT | ANY_TEXT)
def test_other_spellings_of_an_accepted_id_are_refused(task_id: str) -> None:
    """Of the canonically equivalent spellings of a name (NFC, NFD), at most one is valid:
    two tasks never look identical because one is composed and the other decomposed."""
    assume(encoded_or_refused(task_id) is not None)
    for form in ("NFD", "NFC"):
        other = unicodedata.normalize(form, task_id)
        assert other == task_id or encoded_or_refused(other) is None


@given(st.lists(PRINTABLE_TEXT | ANY_TEXT, min_size=2, max_size=8, unique=True))
def test_accepted_ids_map_injectively_and_round_trip(task_ids: list[str]) -> None:
    """Distinct accepted ids get distinct names (also case-folded) that decode back."""
    names = {t: encode_task_id(t) for t in task_ids if encoded_or_refused(t) is not None}
    assert len(names) == len({name.lower() for name in names.values()})
    assert {t: t for t in names} == {t: decode_task_id(name) for t, name in names.items()}


def test_a_decomposed_id_is_refused_with_its_nfc_form_in_the_message() -> None:
    """An NFD id is refused, not normalised: the message shows the NFC spelling to use."""
    decomposed = unicodedata.normalize("NFD", "caf\u00e9")
    with pytest.raises(castore.InvalidTaskIdError) as caught:
        encode_task_id(decomposed)
    assert "not in Unicode NFC form ('cafe\\u0301')" in str(caught.value)
    assert "use its NFC form 'caf\u00e9' ('caf\\xe9')" in str(caught.value)
    assert "caf%C3%A9" == encode_task_id("caf\u00e9")


@pytest.mark.parametrize(
    ("task_id", "reason"),
    [
        ("job\u20281", "character 3 is U+2028 LINE SEPARATOR, a line separator"),
        ("x\u202e", "character 1 is U+202E RIGHT-TO-LEFT OVERRIDE, a format character"),
        ("a\x00", "character 1 is U+0000, a control character"),
        ("a\u00a0b", "U+00A0 NO-BREAK SPACE, a space other than U+0020"),
    ],
)
def test_the_message_names_the_unprintable_character(task_id: str, reason: str) -> None:
    """The error says which character it refused, by position, code point and name, and
    shows the id escaped: the message itself is one printable line."""
    with pytest.raises(castore.InvalidTaskIdError) as caught:
        encode_task_id(task_id)
    assert reason in caught.value.reason
    assert (True, True) == (repr(task_id) in str(caught.value), str(caught.value).isprintable())


HOSTILE_STRINGS = [p for p in REFUSED if isinstance(p.values[0], str) and p.values[0]]


@pytest.mark.parametrize("task_id", HOSTILE_STRINGS)
def test_a_store_refuses_a_hostile_id_before_any_filesystem_call(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch, task_id: str
) -> None:
    """start, resume, open_task, status and verify refuse the id with InvalidTaskIdError
    before touching the filesystem; the store tree is byte-identical afterwards."""
    plan = castore.Plan.build("p", "a")
    before = tree_snapshot(store.root)
    calls: list[str] = []

    def refuse(name: str) -> object:
        def call(*args: object, **kwargs: object) -> object:
            calls.append(f"os.{name}{args!r}")
            raise AssertionError(f"os.{name} called for an invalid task id")

        return call

    attempts = [
        lambda: store.start(task_id, plan),
        lambda: store.resume(task_id, plan),
        lambda: store.open_task(task_id, plan),
        lambda: store.status(task_id),
        lambda: store.verify(task_id),
    ]
    with monkeypatch.context() as patched:
        for name in ("open", "mkdir", "makedirs", "stat", "lstat", "listdir", "scandir", "link"):
            patched.setattr(os, name, refuse(name))
        for attempt in attempts:
            with pytest.raises(castore.InvalidTaskIdError):
                attempt()
    assert ([], before) == (calls, tree_snapshot(store.root))


PLANTED = [
    pytest.param("evil\u2028error: forged line", id="raw-U+2028"),
    pytest.param("evil\nerror: forged line", id="raw-newline"),
    pytest.param("job%E2%80%A81", id="escaped-U+2028"),
    pytest.param("job%C2%851", id="escaped-U+0085"),
    pytest.param("x%E2%80%AEtxt", id="escaped-U+202E"),
    pytest.param("in%E2%80%8Bvoice", id="escaped-U+200B"),
    pytest.param("cafe%CC%81", id="escaped-NFD"),
]


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_task_directory_is_a_finding_printed_escaped(
    store: castore.Store, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A directory made by hand under tasks/ for an id castore refuses is not listed as a
    task, and fsck reports it as bad-task-name on one line, escaped, never raw."""
    with store.start("plain", castore.Plan.build("p", "a")) as run:
        run.commit_step("a", 1)
    os.mkdir(os.path.join(store.layout.tasks, name))
    assert ["plain"] == store.tasks()
    code, out, err = cli(capsys, "fsck", store.root)
    lines = out.splitlines()  # splitlines also breaks at U+2028 and U+0085
    bad = [line for line in lines if "bad-task-name" in line]
    assert (0, "", 1) == (code, err, len(bad))
    assert f"warning: bad-task-name: {layout.display_name('tasks/' + name)}: " in bad[0]
    assert all(line.isprintable() for line in lines)
    code, out, err = cli(capsys, "--store", store.root, "status")
    *task_lines, summary = out.splitlines()  # status closes with a count line
    assert (0, "", ["plain"]) == (code, err, [line.split()[0] for line in task_lines])
    assert summary.startswith("1 task")


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("tasks/job", "tasks/job"),
        ("tasks/caf\u00e9 1", "tasks/caf\u00e9 1"),
        ("tasks/a\u2028b", "'tasks/a\\u2028b'"),
        ("tasks/a\nb", "'tasks/a\\nb'"),
        ("tasks/\udcff", "'tasks/\\udcff'"),
    ],
)
def test_display_name_escapes_only_names_that_are_not_printable(name: str, shown: str) -> None:
    """A printable name prints as itself; any other as its repr, one printable line."""
    assert shown == layout.display_name(name)


@pytest.mark.parametrize(
    "step_id",
    [p for p in HOSTILE_STRINGS if not p.values[0].isprintable()],
)
def test_a_plan_with_an_unprintable_step_id_is_refused(store: castore.Store, step_id: str) -> None:
    """Step ids are printed by status and log like task ids: an unprintable one (a line
    separator, a format character) is refused when the plan is stored, nothing written."""
    plan = castore.Plan.build("p", "fetch", step_id)
    before = tree_snapshot(store.root)
    with pytest.raises(castore.UsageError, match="is not printable"):
        store.start("job", plan)
    assert before == tree_snapshot(store.root)


FORGED = "r-1\u2028error: forged line"


class _Crash(Exception):
    """Leaves an effect block as a crash would."""


def test_status_log_and_watch_print_the_callers_text_on_one_line(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """An idempotency key, a receipt, a reason or a who/why holding a line break is printed
    escaped by status, log and watch alert lines: each record stays one line."""
    plan = castore.Plan.build("p", castore.effect("post"), castore.effect("mail"))
    with store.start("job", plan) as run:
        run.perform("post", castore.Service("forum"), lambda key: FORGED)
        mail = run.effect("mail", castore.Service("m"), key="k-1\nerror: forged key")
        with contextlib.suppress(_Crash), mail:
            raise _Crash  # the effect stays SUBMITTED under the caller's key
    reason = "bounced\u0085error: forged reason"
    store.resolve("job", "mail", not_done=True, reason=reason, who="ana@ops")
    store.override("job", who="ana", why="drift\nerror: forged why", plan=plan)
    for argv in (("log", "job"), ("status",)):
        code, out, err = cli(capsys, "--store", store.root, *argv)
        lines = out.splitlines()  # splits at U+2028, U+2029 and U+0085 too
        assert (0, "", True) == (code, err, all(line.isprintable() for line in lines))
        assert not any(line.startswith("error: forged") for line in lines)
    _, log, _ = cli(capsys, "--store", store.root, "log", "job")
    assert (True, True) == (f"receipt={FORGED!r}" in log, f"why: {reason!r}" in log)
    _, status, _ = cli(capsys, "--store", store.root, "status")
    assert "key 'k-1\\nerror: forged key')" in status
    alert = Alert("stuck", "raised", "job", "post", "k", f"key {FORGED}", 0.0)
    assert f"1970-01-01T00:00:00Z RAISED stuck: {f'key {FORGED}'!r}" == alert_line(alert)


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


def _first_temp_name_in_a_forked_child(pid_seen: int | None = None) -> tuple[int, str]:
    """(the child's pid, the first temp name a forked child makes); `pid_seen`: the pid the
    child's os.getpid() answers, as if it were that one."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child writes its first name and leaves at once
        if pid_seen is not None:
            os.getpid = lambda: pid_seen
        os.write(write_end, layout.temp_name().encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    name = os.read(read_end, 200).decode()
    os.close(read_end)
    return child, name


def test_temp_names_are_unique_in_a_process_and_new_in_a_forked_child() -> None:
    """One host look-up and one random draw per process: the names count up from there, and
    a forked child (a new pid) starts its own prefix and random start."""
    names = [layout.temp_name() for _ in range(10_000)]
    assert len(set(names)) == len(names)
    child, child_name = _first_temp_name_in_a_forked_child()
    parsed = layout.parse_temp_name(child_name)
    assert parsed is not None
    assert child == parsed[1]
    assert child_name[-12:] not in {name[-12:] for name in names}


def test_a_forked_child_with_its_parents_pid_does_not_repeat_its_parents_names() -> None:
    """A child whose pid equals the one its inherited state was made under (pid 1 forked into
    a new PID namespace, a reused pid) still draws a new start: the reset is at fork, not
    by pid."""
    layout.temp_name()
    parent_pid = os.getpid()
    _, child_name = _first_temp_name_in_a_forked_child(pid_seen=parent_pid)
    assert f"-{parent_pid}-" in child_name
    assert child_name != layout.temp_name()  # the parent's next name is not the child's
