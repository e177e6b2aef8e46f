"""The canonical encoding: values to bytes and back, and the object frame around them.

Same value, same bytes, same object id. The data model is JSON's minus its ambiguities:
None, bool, signed 64-bit int, finite float, str (valid unicode), list (tuples encode as
lists) and dict with str keys. Records (attrs classes) go through cattrs; this module is the
only one that knows cattrs exists, and imports it at the first record it converts.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import re
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from castore.errors import EncodingError, FormatVersionError, ObjectTooLargeError
from castore.format import limits
from castore.format.fastdecode import decode_canonical_value, encode_sorted, too_deep
from castore.format.model import attrs
from castore.format.records import EffectState, TransitionKind, omitted_fields

if TYPE_CHECKING:
    import cattrs

# The version a new store's marker names. An object's header names the lowest version whose
# reader understands it (docs/FORMAT.md §18): records that use only v1 fields keep their v1
# bytes, hence their ids, across an upgrade; a v1 reader refuses the rest as unknown, never corrupt.
FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
KINDS = ("plan", "snapshot", "blob", "raw", "tree", "pack")
# Kinds a v1 reader does not know: their header always names version 2.
V2_KINDS = frozenset({"raw", "tree", "pack"})
MAGIC = b"castore"
MAX_HEADER = limits.MAX_HEADER
MAX_DEPTH = limits.MAX_DEPTH
INT_MIN, INT_MAX = -(2**63), 2**63 - 1

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)
_NUMBER = re.compile(rb"0|[1-9][0-9]*")  # canonical decimal: no sign, no leading zero


def _has_omitted(cls: object) -> bool:
    return isinstance(cls, type) and attrs.has(cls) and bool(omitted_fields(cls))


def _exact(cls: type[T]) -> Callable[[object, type[T]], T]:
    """A structure hook that refuses what cattrs would otherwise convert ("1" → 1, 1.7 → 1)."""

    def structure(value: object, _: type[T]) -> T:
        if type(value) is not cls and not (cls is float and type(value) is int):
            raise TypeError(f"expected {cls.__name__}, found {type(value).__name__} {value!r}")
        return value  # type: ignore[return-value]

    return structure


def _enum_hook(cls: type[E]) -> Callable[[object, type[E]], E]:
    def structure(value: object, _: type[E]) -> E:
        if type(value) is not str:
            raise TypeError(f"expected a {cls.__name__} name, found {value!r}")
        return cls(value)

    return structure


def _is_sequence_type(cls: object) -> bool:
    return typing.get_origin(cls) is tuple and typing.get_args(cls)[-1:] == (Ellipsis,)


@functools.cache
def _converter() -> cattrs.Converter:
    """The converter between records and plain data, built at its first use: importing
    cattrs and building its hooks is ~45 ms that a reader which only decodes (`castore
    status`, resume through msgspec) never needs."""
    import cattrs  # noqa: PLC0415 - see above
    from cattrs.gen import make_dict_unstructure_fn, override  # noqa: PLC0415

    converter = cattrs.Converter(forbid_extra_keys=True)
    # StrEnum members are str subclasses, which cattrs passes through as they are; the
    # encoder accepts exact types only, so each enum of the schema unstructures to its value.
    for enum_type in (EffectState, TransitionKind):
        converter.register_unstructure_hook(enum_type, lambda member: str(member.value))
        converter.register_structure_hook(enum_type, _enum_hook(enum_type))

    def omitting_unstructure(cls: Any) -> Callable[[Any], dict[str, Any]]:
        """Records with v2 fields leave them out while None: their v1 bytes stay the same."""
        overrides = {name: override(omit_if_default=True) for name in omitted_fields(cls)}
        return make_dict_unstructure_fn(cls, converter, **overrides)  # type: ignore[arg-type]

    def sequence_hook(cls: Any) -> Callable[[object, Any], tuple[Any, ...]]:
        """tuple[X, ...] fields come from JSON arrays only (cattrs would split "ab" in two)."""
        item = typing.get_args(cls)[0]

        def structure(value: object, _: object) -> tuple[Any, ...]:
            if type(value) is not list:
                raise TypeError(f"expected a list, found {type(value).__name__} {value!r}")
            return tuple(converter.structure(element, item) for element in value)

        return structure

    converter.register_unstructure_hook_factory(_has_omitted, omitting_unstructure)
    for scalar in (int, str, bool, float):
        converter.register_structure_hook(scalar, _exact(scalar))
    converter.register_structure_hook_factory(_is_sequence_type, sequence_hook)
    return converter


def _check(value: object, path: str) -> None:
    """Refuse anything outside the data model before json.dumps can coerce it silently."""
    kind = type(value)  # exact types: bool is not an int here, and subclasses are refused
    if value is None or kind is bool:
        return
    if kind is str:
        _check_str(str(value), path)
    elif kind is int:
        if not INT_MIN <= int(value) <= INT_MAX:  # type: ignore[call-overload]
            raise EncodingError(
                path,
                f"integer {value} does not fit in 64 bits",
                found=f"is {value}, an integer that does not fit in 64 bits",
            )
    elif kind is float:
        if not math.isfinite(float(value)):  # type: ignore[arg-type]
            raise EncodingError(
                path, f"{value} is not a finite number", found=f"is {value}, not a finite number"
            )
    elif isinstance(value, list | tuple) and kind in (list, tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
    elif isinstance(value, dict) and kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise EncodingError(
                    path,
                    f"dict key {key!r} is not a str",
                    found=f"has the key {key!r}, of type {type(key).__name__}: keys must be str",
                )
            _check_str(key, path)
            _check(item, f"{path}.{key}")
    else:
        raise EncodingError(
            path,
            f"{kind.__name__} is not part of the data model",
            found=f"is a {kind.__name__}, which is not part of castore's data model",
        )


def told_of_result(error: EncodingError, owner: str, base: str, advice: str = "") -> EncodingError:
    """`error` worded for the person whose value it is: `owner` ("step 'a' of task 'nj-1'")
    and the result's field a path under `base` (where the result sits in the record) names,
    with the path kept as the detail; `advice` replaces the error's own if given."""
    rest = error.path[len(base) :] if error.path.startswith(base) else None
    if rest == "":
        subject = f"{owner}: the result"
    elif rest is not None and rest[0] == ".":
        subject = f"{owner}: the result's field {rest[1:]!r}"
    elif rest is not None and rest[0] == "[":
        subject = f"{owner}: the result's item {rest!r}"
    else:  # not in the result: a value castore took from elsewhere (a reason, a key)
        return EncodingError(error.path, error.reason, advice or error.advice, subject=owner)
    return EncodingError(
        error.path, error.reason, advice or error.advice, found=error.found, subject=subject
    )


def _check_str(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodingError(
            path, "string contains a lone surrogate", found="holds a lone surrogate"
        ) from None


# What `_plain_kind` finds: not plain (the walks below name what is wrong), plain, or plain
# with a float whose text json and msgspec write differently (an exponent: 1e+16 against 1e16).
_NOT_PLAIN, _PLAIN, _PLAIN_EXPONENT = 0, 1, 2


def _plain_kind(value: object) -> int:
    """Whether json.dumps and msgspec can coerce nothing in `value` silently: exact JSON types,
    str keys, 64-bit ints; and whether msgspec writes its floats as json does. Iterative and
    path-free: the fast path of every commit."""
    kind_found = _PLAIN
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue  # lone surrogates make the encoders raise below
        if kind is float:
            if not math.isfinite(item) or "e" in repr(item):  # type: ignore[arg-type]
                kind_found = _PLAIN_EXPONENT
        elif kind is int:
            if not INT_MIN <= item <= INT_MAX:  # type: ignore[operator]
                return _NOT_PLAIN
        elif kind is list or kind is tuple:
            stack.extend(item)  # type: ignore[arg-type]
        elif kind is dict:
            for key in item:  # type: ignore[attr-defined]  # a loop: half of any()'s cost
                if type(key) is not str:
                    return _NOT_PLAIN
            stack.extend(item.values())  # type: ignore[attr-defined]
        else:
            return _NOT_PLAIN
    return kind_found


# json.dumps with these options builds this same encoder anew at every call: built once.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def encode_value(value: object) -> bytes:
    """Canonical bytes of `value`: compact JSON, keys sorted by code point, UTF-8; at most
    MAX_DEPTH lists and dicts deep. msgspec writes them (in C) unless a float has an exponent,
    which json's text defines (`fastdecode` says why the two agree everywhere else)."""
    kind = _plain_kind(value)
    if kind != _NOT_PLAIN:
        data = encode_sorted(value) if kind == _PLAIN else None
        if data is None:
            data = _json_bytes(value)
        # Each list or dict opens one bracket: few brackets, no need to measure depth.
        if data is not None and (
            data.count(b"[") + data.count(b"{") <= MAX_DEPTH or not too_deep(value, MAX_DEPTH)
        ):
            return data
    check_depth(value)
    _check(value, "$")
    raise EncodingError("$", "a value json.dumps refused")  # _check always raises first


def _json_bytes(value: object) -> bytes | None:
    """json's canonical bytes of `value`; None for NaN, infinity, a lone surrogate or deep
    nesting (the walks of encode_value then name what is wrong)."""
    try:
        return _ENCODER.encode(value).encode("utf-8")
    except (ValueError, UnicodeEncodeError, RecursionError):
        return None


_TOO_DEEP = f"it nests lists and dicts more than {MAX_DEPTH} deep (castore's limit)"
_FLATTEN = "flatten it (a list of rows, a dict of paths), or encode the deep part as a str"


def check_depth(value: object, path: str = "$") -> None:
    """EncodingError if `value` nests more than MAX_DEPTH lists and dicts (checked without
    recursion, before anything recursive walks it)."""
    if too_deep(value, MAX_DEPTH):
        raise EncodingError(path, _TOO_DEEP, _FLATTEN)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("duplicate key in an object: readers could disagree on its value")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not part of the data model")


def bounded_int(text: str) -> int:
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise ValueError(f"integer {text} does not fit in 64 bits")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is not finite")
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique_keys,
    parse_constant=_refuse_constant,
    parse_int=bounded_int,
    parse_float=_finite_float,
)


def decode_value(data: bytes) -> Any:
    """Parse UTF-8 JSON back into a value, refusing what the data model excludes
    (NaN, infinities, ints beyond 64 bits, duplicate keys, more than MAX_DEPTH levels of
    nesting). Lists stay lists."""
    fast = decode_canonical_value(data)  # what writers write: the common case, 3x faster
    return fast[0] if fast is not None else decode_value_strict(data)


def decode_value_strict(data: bytes) -> Any:
    """`decode_value` without its fast path: the definition the fast path must agree with."""
    try:
        value = _DECODER.decode(data.decode("utf-8"))
    except RecursionError:  # hostile nesting: refused like any other bad input
        raise ValueError("nested too deeply to decode") from None
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH and too_deep(value, MAX_DEPTH):
        raise ValueError(f"nested more than {MAX_DEPTH} deep (castore's limit)")
    return value


def frame(kind: str, body: bytes, version: int | None = None) -> bytes:
    """The bytes of an object: a one-line header naming format version, kind and body length.

    `version`: the lowest format version whose reader understands the body (2 when it uses a
    v2-only field); None means the lowest the kind allows (1, or 2 for a v2-only kind)."""
    return frame_header(kind, len(body), version) + body


def frame_header(kind: str, body_length: int, version: int | None = None) -> bytes:
    """The header line `frame` puts before a body of `body_length` bytes (for a body built
    in pieces, which `frame` would have to join)."""
    if kind not in KINDS:
        raise ValueError(f"unknown object kind {kind!r}")
    lowest = 2 if kind in V2_KINDS else 1
    version = lowest if version is None else version
    if version not in SUPPORTED_VERSIONS or version < lowest:
        raise ValueError(f"a {kind} object cannot be framed as format version {version}")
    if body_length > limits.MAX_BODY_SIZE:  # no reader would read it back
        raise ObjectTooLargeError(kind, body_length, limits.MAX_BODY_SIZE)
    return b"%s %d %s %d\n" % (MAGIC, version, kind.encode(), body_length)


class FrameError(ValueError):
    """An object's header is missing, malformed, or disagrees with its length."""

    def __init__(self, reason: str, code: str) -> None:
        self.reason = reason
        self.code = code
        super().__init__(reason)


def _header_pattern(kinds: tuple[str, ...]) -> bytes:
    """Headers of intact objects of `kinds`: each v1 kind under either version, each v2-only
    kind under version 2 alone (a v1 header on a pack is malformed, not an old pack)."""
    v1 = [kind for kind in kinds if kind not in V2_KINDS]
    versions = []
    if v1:
        versions.append(b"1 (?:%s)" % b"|".join(kind.encode() for kind in v1))
    versions.append(b"2 (?:%s)" % b"|".join(kind.encode() for kind in kinds))
    return b"%s (?:%s) (0|[1-9][0-9]{0,19})\n" % (MAGIC, b"|".join(versions))


# The header of an intact object, matched in one step (the checks below name what is wrong).
_WELL_FORMED_HEADER = re.compile(_header_pattern(KINDS))
_INTACT_HEADERS = {kind: re.compile(_header_pattern((kind,))) for kind in KINDS}


def intact_body(data: bytes, kind: str) -> bytes | None:
    """The body of `data` if it is a well-framed object of `kind` (one regex: fsck's hot
    path), else None; `unframe` then says what is wrong, if anything is."""
    header = _INTACT_HEADERS[kind].match(data)
    if header is None or len(data) - header.end() != int(header[1]):
        return None
    return data[header.end() :]


def unframe(data: bytes, where: str = "object") -> tuple[str, bytes]:
    """Split an object into (kind, body); FrameError or FormatVersionError if malformed."""
    header = _WELL_FORMED_HEADER.match(data)
    if header is not None and len(data) - header.end() == int(header[1]):
        # The one path of intact objects: the kind sits between the second and third space.
        kind_end = data.index(b" ", len(MAGIC) + 3)
        return data[len(MAGIC) + 3 : kind_end].decode("ascii"), data[header.end() :]
    newline = data.find(b"\n", 0, MAX_HEADER)
    if newline < 0:
        code = "empty" if not data else "bad-header"
        raise FrameError("no object header" if data else "file is empty", code)
    parts = data[:newline].split(b" ")
    if (
        len(parts) != 4
        or parts[0] != MAGIC
        or not _NUMBER.fullmatch(parts[1])
        or not _NUMBER.fullmatch(parts[3])
    ):
        raise FrameError("malformed object header", "bad-header")
    version = int(parts[1])
    if version not in SUPPORTED_VERSIONS:
        raise FormatVersionError(where, version, SUPPORTED_VERSIONS)
    kind = parts[2].decode("ascii", "replace")
    if kind not in KINDS:
        raise FrameError(f"unknown object kind {kind!r}", "unknown-kind")
    if kind in V2_KINDS and version < 2:
        raise FrameError(f"a {kind} object under a version {version} header", "bad-header")
    body = data[newline + 1 :]
    declared = int(parts[3])
    if len(body) != declared:
        what = "truncated" if len(body) < declared else "has trailing bytes"
        raise FrameError(f"body {what}: {len(body)} of {declared} bytes", "truncated")
    return kind, body


def to_builtins(record: object) -> Any:
    """A record as plain data (dicts and lists), ready for `encode_value`."""
    try:
        return _converter().unstructure(record)
    except RecursionError:  # cattrs recurses into results: far beyond MAX_DEPTH
        raise EncodingError("$", _TOO_DEEP, _FLATTEN) from None


class SchemaError(ValueError):
    """Plain data that does not fit a record's schema; says which field and why."""


def from_builtins(data: object, cls: type[T]) -> T:
    """Build a record from plain data; SchemaError names the first field that does not fit."""
    import cattrs  # noqa: PLC0415 - loaded by the converter: a dictionary lookup from here

    try:
        return _converter().structure(data, cls)
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            detail = "; ".join(cattrs.transform_error(exc, path=cls.__name__)[:3])
        else:
            detail = str(exc) or type(exc).__name__
        raise SchemaError(detail) from exc


def encode_record(kind: str, record: object) -> bytes:
    """The framed object bytes of a record."""
    return frame(kind, encode_value(to_builtins(record)))
