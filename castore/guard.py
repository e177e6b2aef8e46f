"""What a snapshot may not hold: credentials and large payloads (PROTOCOL.md)."""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Collection
from typing import Any

from castore.errors import SecretInPayloadError, SnapshotTooLargeError

DEFAULT_SNAPSHOT_BUDGET = 64 * 1024

# Normalised (lower case, no '-', '_', '.' or spaces) field names that name a credential.
_SECRET_NAMES = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "authorization",
        "auth",
        "cookie",
        "setcookie",
        "credential",
        "credentials",
        "privatekey",
        "sessionid",
    }
)
_SECRET_SUFFIXES = (
    "password",
    "passwd",
    "secret",
    "apikey",
    "privatekey",
    "secretkey",
    "clientsecret",
    "credentials",
    "authorization",
    "accesskey",
    "signingkey",
    "encryptionkey",
    "token",
)
# Names ending in "token" that are not credentials (pagination cursors).
_BENIGN_SUFFIXES = ("pagetoken", "nexttoken", "continuationtoken", "cursortoken", "synctoken")
# Shapes of well-known credentials; each named so the error says which one matched. Every
# repetition is bounded or anchored by a literal prefix, so a scan stays linear in the text.
_SECRET_VALUES = (
    ("a PEM private key", re.compile(r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----")),
    (
        "an HTTP Authorization value",
        re.compile(r"\b(?:Bearer|Token)\s+(?=[\w.~+/=-]{0,512}\d)[\w.~+/=-]{16,512}"),
    ),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,})")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a Stripe secret key", re.compile(r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}")),
    (
        "an OpenAI-style API key",
        re.compile(r"\bsk-(?:proj-|ant-)?(?=[\w-]{0,256}\d)[\w-]{32,256}"),
    ),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("a JSON Web Token", re.compile(r"\beyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]+")),
    (
        "a URL with a password",
        re.compile(r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,31}://[^/\s:@]{1,256}:[^/\s@]{1,256}@"),
    ),
)
_BASIC_AUTH = re.compile(r"\bBasic\s+([A-Za-z0-9+/]{8,512}={0,2})(?![\w+/=])")


def _normalise(name: str) -> str:
    return re.sub(r"[-_. ]", "", name.lower())


@functools.lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """True if a field called `name` would hold a credential."""
    norm = _normalise(name)
    if norm.endswith(_BENIGN_SUFFIXES):
        return False
    return norm in _SECRET_NAMES or norm.endswith(_SECRET_SUFFIXES)


def secret_value(text: str) -> str | None:
    """The kind of credential `text` looks like, or None."""
    for label, pattern in _SECRET_VALUES:
        if pattern.search(text):
            return label
    for match in _BASIC_AUTH.finditer(text):
        if _is_basic_credentials(match.group(1)):
            return "an HTTP Basic Authorization value"
    return None


def _is_basic_credentials(encoded: str) -> bool:
    """Basic auth is base64 of "user:password"; plain words after "Basic" are not."""
    try:
        decoded = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        return b":" in decoded and decoded.isascii()
    except (binascii.Error, ValueError):
        return False


def refuse_secrets(value: Any, allow: Collection[str] = (), path: str = "$") -> None:
    """Raise SecretInPayloadError for the first secret-looking field name or value.

    `allow` names fields (by key, or by full path like `$.transition.result.token`)
    that the caller vouches for.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}"
            if key in allow or child in allow:
                continue
            if secret_name(key) and item not in (None, "", [], {}):
                raise SecretInPayloadError(child, f"field name {key!r} names a credential")
            refuse_secrets(item, allow, child)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            refuse_secrets(item, allow, f"{path}[{index}]")
    elif isinstance(value, str):
        label = secret_value(value)
        if label is not None:
            raise SecretInPayloadError(path, f"the value looks like {label}")


def check_size(encoded: bytes, parts: dict[str, Any], budget: int) -> None:
    """Raise SnapshotTooLargeError naming the largest part if `encoded` exceeds `budget`."""
    if len(encoded) <= budget:
        return
    sizes = {name: len(repr(part)) for name, part in parts.items()}
    biggest = max(sizes, key=lambda name: sizes[name])
    raise SnapshotTooLargeError(len(encoded), budget, biggest)
