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
This is the only module that imports msgspec.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

# 2**63 has 19 digits: every int outside the data model has at least that many. Mapping
# every digit to "0" and the rest to " " turns the search into a substring test (a regex
# costs ten times more, and this runs on every object fsck reads).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_DIGIT_RUN = b"0" * 19


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

    def decode(body: bytes) -> T | None:
        if _LONG_DIGIT_RUN in body.translate(_DIGITS_AS_ZEROS):
            return None
        try:
            record: T = decoder.decode(body)
            again = encode(record)
        except _UNSURE:
            return None  # the strict path will say what is wrong, if anything is
        return record if again == body else None

    _DECODERS[cls] = decode
    return decode


def decode_canonical(body: bytes, cls: type[T]) -> T | None:
    """The record of type `cls` that `body` encodes, if `body` is its canonical encoding;
    None when this path cannot tell (the strict path in `codec` then decides)."""
    return canonical_decoder(cls)(body)


_ANY_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(float_hook=_plain_float)


def decode_canonical_value(body: bytes) -> tuple[Any] | None:
    """(value,) for the canonical body of any JSON value (a blob), or None when unsure."""
    if _LONG_DIGIT_RUN in body.translate(_DIGITS_AS_ZEROS):
        return None
    try:
        value = _ANY_DECODER.decode(body)
        again = _ENCODER.encode(value)
    except _UNSURE:
        return None
    return (value,) if again == body else None
