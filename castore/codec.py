"""The canonical encoding: values to bytes and back, and the object frame around them.

Same value, same bytes, same object id. The data model is JSON's minus its ambiguities:
None, bool, signed 64-bit int, finite float, str (valid unicode), list (tuples encode as
lists) and dict with str keys. Records (attrs classes) go through cattrs; this module and
`records` are the only ones that know cattrs exists.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

import cattrs

from castore.errors import EncodingError, FormatVersionError
from castore.records import EffectState, TransitionKind

FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
KINDS = ("plan", "snapshot", "blob")
MAGIC = b"castore"
MAX_HEADER = 64
INT_MIN, INT_MAX = -(2**63), 2**63 - 1

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True)
# StrEnum members are str subclasses, which cattrs passes through as they are; the encoder
# accepts exact types only, so each enum of the schema unstructures to its plain value.
for _enum in (EffectState, TransitionKind):
    converter.register_unstructure_hook(_enum, lambda member: str(member.value))


def _check(value: object, path: str) -> None:
    """Refuse anything outside the data model before json.dumps can coerce it silently."""
    kind = type(value)  # exact types: bool is not an int here, and subclasses are refused
    if value is None or kind is bool:
        return
    if kind is str:
        _check_str(str(value), path)
    elif kind is int:
        if not INT_MIN <= int(value) <= INT_MAX:  # type: ignore[call-overload]
            raise EncodingError(path, f"integer {value} does not fit in 64 bits")
    elif kind is float:
        if not math.isfinite(float(value)):  # type: ignore[arg-type]
            raise EncodingError(path, f"{value} is not a finite number")
    elif isinstance(value, list | tuple) and kind in (list, tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
    elif isinstance(value, dict) and kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise EncodingError(path, f"dict key {key!r} is not a str")
            _check_str(key, path)
            _check(item, f"{path}.{key}")
    else:
        raise EncodingError(path, f"{kind.__name__} is not part of the data model")


def _check_str(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodingError(path, "string contains a lone surrogate") from None


def encode_value(value: object) -> bytes:
    """Canonical bytes of `value`: compact JSON, keys sorted by code point, UTF-8."""
    _check(value, "$")
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def decode_value(data: bytes) -> Any:
    """Parse canonical bytes back into a value (lists stay lists)."""
    return json.loads(data)


def frame(kind: str, body: bytes) -> bytes:
    """The bytes of an object: a one-line header naming format, kind and body length."""
    if kind not in KINDS:
        raise ValueError(f"unknown object kind {kind!r}")
    return b"%s %d %s %d\n" % (MAGIC, FORMAT_VERSION, kind.encode(), len(body)) + body


class FrameError(ValueError):
    """An object's header is missing, malformed, or disagrees with its length."""

    def __init__(self, reason: str, code: str) -> None:
        self.reason = reason
        self.code = code
        super().__init__(reason)


def unframe(data: bytes, where: str = "object") -> tuple[str, bytes]:
    """Split an object into (kind, body); FrameError or FormatVersionError if malformed."""
    newline = data.find(b"\n", 0, MAX_HEADER)
    if newline < 0:
        code = "empty" if not data else "bad-header"
        raise FrameError("no object header" if data else "file is empty", code)
    parts = data[:newline].split(b" ")
    if len(parts) != 4 or parts[0] != MAGIC or not parts[1].isdigit() or not parts[3].isdigit():
        raise FrameError("malformed object header", "bad-header")
    version = int(parts[1])
    if version not in SUPPORTED_VERSIONS:
        raise FormatVersionError(where, version, SUPPORTED_VERSIONS)
    kind = parts[2].decode("ascii", "replace")
    if kind not in KINDS:
        raise FrameError(f"unknown object kind {kind!r}", "unknown-kind")
    body = data[newline + 1 :]
    declared = int(parts[3])
    if len(body) != declared:
        what = "truncated" if len(body) < declared else "has trailing bytes"
        raise FrameError(f"body {what}: {len(body)} of {declared} bytes", "truncated")
    return kind, body


def to_builtins(record: object) -> Any:
    """A record as plain data (dicts and lists), ready for `encode_value`."""
    return converter.unstructure(record)


def from_builtins(data: object, cls: type[T]) -> T:
    """Build a record from plain data; cattrs validates shape and types."""
    return converter.structure(data, cls)


def encode_record(kind: str, record: object) -> bytes:
    """The framed object bytes of a record."""
    return frame(kind, encode_value(to_builtins(record)))
