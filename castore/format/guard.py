"""What a snapshot may not hold: credentials and large payloads (docs/reference/payloads.md).

The secret guard looks at everything a caller hands in to be stored: each string value (in
lists too), each dict key at any depth, the task id and the environment anchor. It refuses:

- a **value or key shaped like a well-known credential** (`secret_value`): PEM private keys,
  `Authorization: Bearer/Basic` values, URLs with `user:password@`, JWTs and the prefixed
  tokens of AWS, GitHub, GitLab, npm, PyPI, Hugging Face, Slack, Stripe, OpenAI, Anthropic,
  Google and SendGrid (the shapes of the gitleaks and detect-secrets rules);
- a **field whose name means a credential** (`secret_name`) and that holds something (not
  null, a bool or empty). A name is split into words at `_ - . ` and camelCase, lower cased,
  trailing digits dropped ("X-Api-Key", "xApiKey", "x_api_key2": x, api, key). Trailing words
  that only say how the value is written (value, string, raw, b64, header, ...) are set aside.
  The name is a credential if its last word is one (password, secret, token, auth,
  authorization, cookie, credentials, ...; also glued: "pgpassword", "csrftoken") or its last
  two words are ("api key", "private key", "session id", "access tokens", ...), unless a word
  before that term makes the field a count, a flag or a cursor ("has_password",
  "prompt_token", "max_tokens", "next_page_token"). A name whose last word is not a
  credential is harmless ("password_set", "token_count", "private_key_path", "secret_name").

`allow_fields` vouches for a field by key or by full path (`$.transition.result.token`;
`$.task` and `$.env` for the task id and the anchor): neither it nor what it holds is checked.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Collection
from typing import Any

from castore.errors import SecretInPayloadError, SnapshotTooLargeError

DEFAULT_SNAPSHOT_BUDGET = 64 * 1024

# -- field names (the rule is in the module docstring) -----------------------------------
# One word that names a credential.
_CREDENTIAL_WORDS = frozenset(
    {
        "password", "passwords", "passwd", "passphrase", "secret", "secrets",
        "token", "credential", "credentials", "authorization", "auth", "bearer", "jwt",
        "cookie", "cookies", "apikey", "apikeys", "privatekey", "secretkey", "accesskey",
        "sessionid", "authtoken", "accesstoken", "refreshtoken", "clientsecret", "setcookie",
    }
)  # fmt: skip
# Two words that together name one: "api key", "session id", "access tokens" (plural "tokens"
# alone is what a tokenizer returns; "key" alone is a cache or idempotency key).
_CREDENTIAL_PAIRS = frozenset(
    {f"{word} key" for word in (
        "api", "secret", "private", "access", "signing", "encryption", "master", "session",
        "auth", "client", "consumer", "ssh", "deploy", "hmac", "webhook", "app",
    )}
    | {f"{word} tokens" for word in (
        "access", "refresh", "auth", "api", "bearer", "oauth", "session", "id", "csrf",
    )}
    | {"session id"}
)  # fmt: skip
# A credential word glued to others, in one word ("pgpassword", "csrftoken", "xapikey").
_GLUED_SUFFIXES = ("password", "passwd", "passphrase", "secret", "token", "apikey", "privatekey")
# The same, glued to a credential word ("pagetoken", "maxtoken"; not "count": "accounttoken").
_GLUED_QUALIFIERS = ("page", "next", "continuation", "cursor", "sync", "resume", "prompt", "max")
# Words before the credential term that make the field a count, a flag or a page cursor.
_QUALIFIERS = frozenset(
    {
        "has", "is", "needs", "requires", "uses", "no", "num", "n", "count", "max", "min",
        "total", "prompt", "completion", "input", "output", "cached", "reasoning",
        "page", "next", "prev", "continuation", "cursor", "sync", "resume",
    }
)  # fmt: skip
# Trailing words that say how a credential is written, not what the field is.
_TRANSPARENT = frozenset(
    {
        "value", "val", "string", "str", "text", "plain", "plaintext", "raw", "data",
        "b64", "base64", "hex", "bytes", "header", "headers",
    }
)  # fmt: skip
_WORD = re.compile(r"[A-Z]+[0-9]*(?![a-z])|[A-Z]?[a-z]+[0-9]*")


def name_words(name: str) -> list[str]:
    """The words of a field name, lower case, without trailing digits (but "b64" stays):
    "X-Api-Key", "xApiKey" and "x_api_key2" all give [x, api, key]."""
    words = (word.lower() for word in _WORD.findall(name))
    return [word if word in _TRANSPARENT else word.rstrip("0123456789") for word in words]


def _credential_word(word: str, alone: bool) -> bool:
    if word == "pwd":
        return not alone  # "db_pwd" is a password; "pwd" alone, a shell's working directory
    if word in _CREDENTIAL_WORDS:
        return True
    for suffix in _GLUED_SUFFIXES:
        if word.endswith(suffix) and word != suffix:
            return not word[: -len(suffix)].endswith(_GLUED_QUALIFIERS)  # "nextpagetoken"
    return False


@functools.lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """True if a field called `name` would hold a credential (the module docstring says when)."""
    words = name_words(name)
    while len(words) > 1 and words[-1] in _TRANSPARENT:
        words.pop()
    if len(words) >= 2 and " ".join(words[-2:]) in _CREDENTIAL_PAIRS:
        before = words[:-2]
    elif words and _credential_word(words[-1], alone=len(words) == 1):
        before = words[:-1]
    else:
        return False
    return not _QUALIFIERS.intersection(before)


# -- values ------------------------------------------------------------------------------------
# Shapes of well-known credentials (gitleaks and detect-secrets rules, the vendors' documented
# prefixes); each named so the error says which one matched. Every repetition is bounded or
# anchored by a literal prefix, so a scan stays linear in the text.
_SECRET_VALUES = (
    ("a PEM private key", re.compile(r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY(?: BLOCK)?-----")),
    (
        "an HTTP Authorization value",
        re.compile(r"\b(?:Bearer|Token)\s+(?=[\w.~+/=-]{0,512}\d)[\w.~+/=-]{16,512}"),
    ),
    ("an AWS access key id", re.compile(r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,})")),
    (
        "a GitLab token",
        re.compile(
            r"\b(?:gl(?:pat|ptt|dt|rt|cbt|oas|soat|ft|imt|agent)-[\w-]{20,}|GR1348941[\w-]{20})"
        ),
    ),
    ("an npm token", re.compile(r"\bnpm_[A-Za-z0-9]{36}")),
    ("a PyPI token", re.compile(r"\bpypi-AgEIcHlwaS5vcmc[\w-]{50,}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z]{34}\b")),
    (
        "a Slack token",
        re.compile(r"\b(?:xox[abposre]-[A-Za-z0-9-]{10,}|xapp-\d-[A-Za-z0-9-]{10,})"),
    ),
    (
        "a Slack webhook URL",
        re.compile(r"hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/]{20,}"),
    ),
    ("a Stripe secret key", re.compile(r"\b[rs]k_(?:live|test|prod)_[A-Za-z0-9]{10,}")),
    (
        "an OpenAI or Anthropic API key",
        re.compile(r"\bsk-(?=[\w-]{0,256}\d)[\w-]{32,256}"),
    ),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("a Google OAuth token", re.compile(r"\bya29\.[\w-]{20,}")),
    ("a SendGrid API key", re.compile(r"\bSG\.[\w-]{16,32}\.[\w-]{16,64}")),
    ("a JSON Web Token", re.compile(r"\beyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]+")),
    (
        "a URL with a password",
        re.compile(r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,31}://[^/\s:@]{1,256}:[^/\s@]{1,256}@"),
    ),
)
# All shapes in one pass over the text (the one that matches first names the error).
_ANY_SECRET = re.compile(
    "|".join(f"(?P<shape{i}>{pattern.pattern})" for i, (_, pattern) in enumerate(_SECRET_VALUES))
)
_BASIC_AUTH = re.compile(r"\bBasic\s+([A-Za-z0-9+/]{8,512}={0,2})(?![\w+/=])")


def secret_value(text: str) -> str | None:
    """The kind of credential `text` looks like, or None."""
    match = _ANY_SECRET.search(text)
    if match is not None and match.lastgroup is not None:
        return _SECRET_VALUES[int(match.lastgroup.removeprefix("shape"))][0]
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


# Field names repeat from one commit to the next: each is judged once. So do short values (a
# step's effect records ride along in every snapshot until confirmed): judged once each, up to
# a bound on what the memo holds (4,096 texts of at most 256 characters: ~1 MB).
_key_shape = functools.lru_cache(maxsize=4096)(secret_value)
_REMEMBERED = 256
_value_shape = functools.lru_cache(maxsize=4096)(secret_value)


def _holds_nothing(value: Any) -> bool:
    """A value no credential fits in: a flag, null, or empty ({"password": false} is a flag)."""
    return value is None or isinstance(value, bool) or value in ("", [], {}, ())


def refuse_secrets(value: Any, allow: Collection[str] = (), path: str = "$") -> None:
    """Raise SecretInPayloadError for the first secret-looking field name, key or value.

    Every dict key at any depth is checked twice: as a field name (the word rule above) and as
    text (a token used as a key is still stored). Every string, in lists too, is checked for
    credential shapes. `allow` names fields (by key, or by full path like
    `$.transition.result.token`) that the caller vouches for: neither the field nor what it
    holds is checked. A key that looks like a credential is shown only by its first four
    characters, so the error does not repeat the secret.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                continue  # a non-str key is refused by the encoder
            if allow and (key in allow or f"{path}.{key}" in allow):
                continue
            label = _key_shape(key)
            if label is not None:
                where = f"{path}.{key[:4]}…"
                raise SecretInPayloadError(where, f"the field name looks like {label}")
            if secret_name(key) and not _holds_nothing(item):
                raise SecretInPayloadError(
                    f"{path}.{key}", f"field name {key!r} names a credential"
                )
            if item is not None and not isinstance(item, int | float):  # a number holds none
                refuse_secrets(item, allow, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            refuse_secrets(item, allow, f"{path}[{index}]")
    elif isinstance(value, str):
        remembered = type(value) is str and len(value) <= _REMEMBERED  # exact str: its own ==
        label = _value_shape(value) if remembered else secret_value(value)
        if label is not None:
            raise SecretInPayloadError(path, f"the value looks like {label}")


def check_size(encoded: bytes, parts: dict[str, Any], budget: int) -> None:
    """Raise SnapshotTooLargeError naming the largest part if `encoded` exceeds `budget`."""
    if len(encoded) <= budget:
        return
    sizes = {name: len(repr(part)) for name, part in parts.items()}
    biggest = max(sizes, key=lambda name: sizes[name])
    raise SnapshotTooLargeError(len(encoded), budget, biggest)
