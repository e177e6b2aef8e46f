"""What a snapshot may not hold: credentials and large payloads (PROTOCOL.md)."""

from __future__ import annotations

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
    "accesstoken",
    "refreshtoken",
    "authtoken",
    "bearertoken",
    "sessiontoken",
    "idtoken",
    "privatekey",
    "secretkey",
    "clientsecret",
    "credentials",
    "authorization",
)
# Shapes of well-known credentials; each named so the error says which one matched.
_SECRET_VALUES = (
    ("a PEM private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    (
        "an HTTP Authorization value",
        re.compile(r"^(?:Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}"),
    ),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    (
        "a GitHub token",
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
    ),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a Stripe secret key", re.compile(r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("an OpenAI-style API key", re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    (
        "a JSON Web Token",
        re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+"),
    ),
    ("a URL with a password", re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
)


def _normalise(name: str) -> str:
    return re.sub(r"[-_. ]", "", name.lower())


@functools.lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """True if a field called `name` would hold a credential."""
    norm = _normalise(name)
    return norm in _SECRET_NAMES or norm.endswith(_SECRET_SUFFIXES)


def secret_value(text: str) -> str | None:
    """The kind of credential `text` looks like, or None."""
    for label, pattern in _SECRET_VALUES:
        if pattern.search(text):
            return label
    return None


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
