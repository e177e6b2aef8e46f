"""The store marker `castore.json` (docs/FORMAT.md §3): its bytes, and what a reader makes of
them. Pure: the medium reads and writes it."""

from __future__ import annotations

from castore.errors import FormatVersionError
from castore.format import codec

MARKER = {"format": "castore", "version": codec.FORMAT_VERSION}


def marker_bytes(version: int = codec.FORMAT_VERSION) -> bytes:
    """The 33 bytes of the marker of format `version` (docs/FORMAT.md §3)."""
    return codec.encode_value({"format": "castore", "version": version}) + b"\n"


MARKER_BYTES = marker_bytes()


def parse_version(data: bytes, where: str) -> int | None:
    """The format version these marker bytes name; None if they are not castore's marker;
    FormatVersionError (naming `where`) for a version this castore does not read."""
    try:
        marker = codec.decode_value(data)
    except ValueError:
        return None
    if not isinstance(marker, dict) or marker.get("format") != "castore":
        return None
    version = marker.get("version")
    # type(): a JSON `true` equals 1 in Python, and is no version.
    if type(version) is not int or version not in codec.SUPPORTED_VERSIONS:
        raise FormatVersionError(where, version, codec.SUPPORTED_VERSIONS)
    return version
