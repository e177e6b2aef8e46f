"""The secret guard (castore.format.guard) as a table: credential shapes a real agent carries,
refused wherever they appear (values, lists, dict keys at any depth, task ids, environment anchors),
and the look-alikes it must let through. Each refusal leaves the store byte-identical.

Every token is assembled from parts at run time, so this file does not trip secret scanners.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from helpers import tree_snapshot

import castore
from castore.format import guard

TASK = "agent-1"
PLAN = castore.Plan.build("agent", "think", "report")

ALNUM = "a1B2c3D4e5F6g7H8i9J0"  # 20 characters, letters and digits
PEM_BODY = "\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END "


def _basic(user_password: str) -> str:
    return "Basic " + base64.b64encode(user_password.encode()).decode()


# (id, value, what the error says it looks like): shapes from the gitleaks and detect-secrets
# rules and the vendors' documented token formats.
SECRET_VALUES = [
    ("github-classic", "gh" + "p_" + ALNUM + ALNUM[:16], "a GitHub token"),
    ("github-oauth", "gh" + "o_" + ALNUM + ALNUM[:16], "a GitHub token"),
    ("github-user-to-server", "gh" + "u_" + ALNUM + ALNUM[:16], "a GitHub token"),
    ("github-actions", "gh" + "s_" + ALNUM + ALNUM[:16], "a GitHub token"),
    ("github-refresh", "gh" + "r_" + ALNUM + ALNUM[:16], "a GitHub token"),
    ("github-fine-grained", "github" + "_pat_11" + ALNUM + "_" + ALNUM * 3, "a GitHub token"),
    ("gitlab-pat", "gl" + "pat-" + ALNUM, "a GitLab token"),
    ("gitlab-deploy", "gl" + "dt-" + ALNUM + "xy", "a GitLab token"),
    ("gitlab-runner", "gl" + "rt-" + ALNUM + "_z", "a GitLab token"),
    ("npm", "np" + "m_" + ALNUM + ALNUM[:16], "an npm token"),
    ("pypi", "pypi" + "-AgEIcHlwaS5vcmc" + ALNUM * 3, "a PyPI token"),
    ("hugging-face", "hf" + "_" + "AbCdEfGhIj" * 3 + "KlMn", "a Hugging Face token"),
    ("slack-bot", "xo" + "xb-1234567890-" + "abcdefghijkl", "a Slack token"),
    ("slack-user", "xo" + "xp-1234567890-" + "abcdefghijkl", "a Slack token"),
    ("slack-app", "xa" + "pp-1-A0123456789-1234567890-" + "abcdef", "a Slack token"),
    (
        "slack-webhook",
        "https://hooks.slack" + ".com/services/T0000000/B0000000/" + ALNUM + "abcd",
        "a Slack webhook URL",
    ),
    ("stripe-live", "sk" + "_live_" + ALNUM + "abcd", "a Stripe secret key"),
    ("stripe-restricted", "rk" + "_live_" + ALNUM + "abcd", "a Stripe secret key"),
    ("stripe-test", "sk" + "_test_" + ALNUM + "abcd", "a Stripe secret key"),
    ("openai-legacy", "sk-" + ALNUM + "T3Blbk" + "FJ" + ALNUM, "an OpenAI or Anthropic API key"),
    (
        "openai-project",
        "sk-" + "proj-" + ALNUM * 2 + "T3Blbk" + "FJ" + ALNUM * 2,
        "an OpenAI or Anthropic API key",
    ),
    (
        "openai-service-account",
        "sk-" + "svcacct-" + ALNUM * 3,
        "an OpenAI or Anthropic API key",
    ),
    (
        "anthropic",
        "sk-" + "ant-api03-" + ALNUM * 4 + "_-" + "x" * 11 + "AA",  # 93 characters, then AA
        "an OpenAI or Anthropic API key",
    ),
    ("google-api-key", "AI" + "za" + "Sy" + ALNUM + "_-" + "abcdefghijk", "a Google API key"),
    ("google-oauth", "ya" + "29." + "a0AfH6SM" + ALNUM, "a Google OAuth token"),
    ("sendgrid", "SG" + "." + ALNUM + "xy" + "." + ALNUM * 2 + "abc", "a SendGrid API key"),
    ("aws-access-key", "AK" + "IA" + "IOSFODNN7EXAMPLE", "an AWS access key id"),
    ("aws-session-key", "AS" + "IA" + "IOSFODNN7EXAMPLE", "an AWS access key id"),
    ("pem-rsa", "-----BEGIN " + "RSA PRIVATE KEY-----" + PEM_BODY, "a PEM private key"),
    ("pem-openssh", "-----BEGIN " + "OPENSSH PRIVATE KEY-----" + PEM_BODY, "a PEM private key"),
    ("pem-pkcs8", "-----BEGIN " + "PRIVATE KEY-----" + PEM_BODY, "a PEM private key"),
    ("pgp-private", "-----BEGIN " + "PGP PRIVATE KEY BLOCK-----" + PEM_BODY, "a PEM private key"),
    (
        "jwt",
        "ey" + "JhbGciOiJIUzI1NiJ9" + ".ey" + "JzdWIiOiIxMjM0NTY3ODkwIn0" + "." + ALNUM + "_-x",
        "a JSON Web Token",
    ),
    ("bearer", "Bearer " + "abc.def.ghi123456", "an HTTP Authorization value"),
    ("basic", _basic("ana" + ":" + "hunter2"), "an HTTP Basic Authorization value"),
    ("url-password", "postgres://admin:" + "hunter2@db.internal:5432/app", "a URL with a password"),
]
VALUES = [pytest.param(value, label, id=name) for name, value, label in SECRET_VALUES]


def _refused(store: castore.Store, write: Callable[[], object]) -> castore.SecretInPayloadError:
    """Run `write`, expect SecretInPayloadError and a byte-identical store."""
    before = tree_snapshot(store.root)
    with pytest.raises(castore.SecretInPayloadError) as caught:
        write()
    assert before == tree_snapshot(store.root)
    return caught.value


def _fresh_run(store: castore.Store) -> castore.Run:
    return store.start(TASK, PLAN)


# -- where a credential can hide ------------------------------------------------------------------


@pytest.mark.parametrize(("value", "label"), VALUES)
def test_a_credential_value_is_refused_in_a_result_and_in_a_list(
    store: castore.Store, value: str, label: str
) -> None:
    """A token as a field's value, in a list, or quoted in a log line is refused by its shape."""
    with _fresh_run(store) as run:
        for result, path in [
            ({"notes": value}, "$.transition.result.notes"),
            ({"notes": ["ok", value]}, "$.transition.result.notes[1]"),
            ({"log": [{"line": f"sent {value} upstream"}]}, "$.transition.result.log[0].line"),
        ]:
            error = _refused(store, lambda result=result: run.commit_step("think", result))
            assert (path, f"the value looks like {label}") == (error.path, error.why)
    assert 0 == store.verify(TASK).head.seq


@pytest.mark.parametrize(("value", "label"), VALUES)
def test_a_credential_used_as_a_dict_key_is_refused_at_any_depth(
    store: castore.Store, value: str, label: str
) -> None:
    """A token used as a key (a cache keyed by token, a header map) is refused, at the top or
    nested in a list of dicts; the error shows only its first four characters."""
    with _fresh_run(store) as run:
        for result, path in [
            ({value: "user-1"}, "$.transition.result."),
            (
                {"rows": [{"ok": 1}, {"users": {value: 3}}]},
                "$.transition.result.rows[1].users.",
            ),
        ]:
            error = _refused(store, lambda result=result: run.commit_step("think", result))
            expected = (path + value[:4] + "…", f"the field name looks like {label}")
            assert expected == (error.path, error.why)
            assert value not in str(error)
    _refused(store, lambda: store.put_blob({"index": {value: 1}}))
    meta = castore.Plan.build("agent", "think", headers={value: "x"})
    _refused(store, lambda: store.put_plan(meta))


@pytest.mark.parametrize(("value", "label"), VALUES)
def test_a_credential_as_a_task_id_is_refused_before_anything_is_written(
    store: castore.Store, value: str, label: str
) -> None:
    """start and open_task refuse a task id that looks like a credential (it would name a
    directory and sit in every snapshot); nothing appears in the store."""
    task_id = value.replace("\n", " ")[:200]  # a task id is printable and at most 200 bytes
    for attempt in (lambda: store.start(task_id, PLAN), lambda: store.open_task(task_id, PLAN)):
        error = _refused(store, attempt)
        assert ("$.task", f"the value looks like {label}") == (error.path, error.why)
    assert [] == store.tasks()


@pytest.mark.parametrize(("value", "label"), VALUES)
def test_a_credential_as_the_environment_anchor_is_refused(
    store: castore.Store, value: str, label: str
) -> None:
    """An env source whose value looks like a credential (recorded in clear in every snapshot)
    is refused at start, as a str or a function, before anything is written."""
    for env in (value, lambda: value):
        error = _refused(store, lambda env=env: store.start(TASK, PLAN, env=env))
        assert ("$.env", f"the value looks like {label}") == (error.path, error.why)
    assert [] == store.tasks()


def test_a_new_anchor_that_looks_like_a_credential_is_refused_at_commit(
    store: castore.Store,
) -> None:
    """An env source that turns into a credential later is refused at the commit that would
    record it; an override to such an anchor is refused too. HEAD keeps the old anchor."""
    live = ["env:1"]
    with store.start(TASK, PLAN, env=lambda: live[0]) as run:
        live[0] = SECRET_VALUES[0][1]
        error = _refused(store, lambda: run.commit_step("think", 1))
        assert "$.env" == error.path
    _refused(store, lambda: store.override(TASK, who="ana", why="new env", env=live[0]))
    assert "env:1" == store.verify(TASK).head.env


def test_resume_refuses_a_credential_task_id_unless_vouched_for(store: castore.Store) -> None:
    """A task whose id looks like a credential (started with allow_fields=["$.task"]) is not
    resumed without the same allowance, which then lets it go on."""
    task_id = {n: v for n, v, _ in SECRET_VALUES}["npm"]
    with store.start(task_id, PLAN, allow_fields=["$.task"]) as run:
        run.commit_step("think", 1)
    error = _refused(store, lambda: store.resume(task_id, PLAN))
    assert "$.task" == error.path
    with store.resume(task_id, PLAN, allow_fields=["$.task"]) as run:
        run.commit_step("report", 2)
    assert 2 == store.verify(task_id).head.seq


def test_allow_fields_vouches_for_the_env_anchor(store: castore.Store) -> None:
    """allow_fields=["$.env"] lets an anchor through that only looks like a credential."""
    anchor = "config:" + "AK" + "IA" + "IOSFODNN7EXAMPLE"
    with store.start(TASK, PLAN, env=anchor, allow_fields=["$.env"]) as run:
        run.commit_step("think", 1)
    assert anchor == store.verify(TASK).head.env


def test_env_digests_store_no_secret_in_clear(store: castore.Store) -> None:
    """env_digest of a configuration that holds a credential records only its digest, which
    the guard accepts: the anchor is what is stored, and it holds no secret."""
    anchor = castore.env_digest({"region": "eu", "token": SECRET_VALUES[0][1]})
    with store.start(TASK, PLAN, env=anchor) as run:
        run.commit_step("think", 1)
    assert (anchor, True) == (store.verify(TASK).head.env, anchor.startswith("value:"))


# -- field names ----------------------------------------------------------------------------------

REFUSED_NAMES = [
    ("password", "the plain word"),
    ("db_password", "qualified by what it opens"),
    ("PGPASSWORD", "a credential glued into one word (libpq's variable)"),
    ("MYSQL_PWD", "pwd after another word is a password"),
    ("passphrase", "an SSH or GPG key's passphrase"),
    ("api_key", "two words that name a credential"),
    ("apiKey", "camelCase"),
    ("X-Api-Key", "an HTTP header"),
    ("APIKey", "an acronym before a word"),
    ("access_token", "OAuth"),
    ("refresh_token", "OAuth"),
    ("id_token", "OpenID Connect"),
    ("auth_token", "generic"),
    ("github_token", "a service's token"),
    ("csrftoken", "glued, Django's cookie name"),
    ("auth_tokens", "a list of tokens"),
    ("token", "the plain word"),
    ("secret", "the plain word"),
    ("client_secret", "OAuth"),
    ("webhook_secret", "a signing secret"),
    ("aws_secret_access_key", "AWS"),
    ("private_key", "two words"),
    ("signing_key", "two words"),
    ("authorization", "an HTTP header"),
    ("Proxy-Authorization", "an HTTP header"),
    ("basic_auth", "user:password"),
    ("cookie", "a session cookie"),
    ("Set-Cookie", "an HTTP header"),
    ("session_id", "a session"),
    ("sessionId", "camelCase"),
    ("credentials", "the plain word"),
    ("password_value", "a trailing word that only says how it is written"),
    ("authorization_header", "the header's value"),
    ("token_b64", "encoded, still a token"),
]
ALLOWED_NAMES = [
    ("has_password", "a flag"),
    ("is_secret", "a flag"),
    ("needs_token", "a flag"),
    ("has_api_key", "a flag"),
    ("password_set", "the last word is not a credential"),
    ("password_changed_at", "a time"),
    ("password_policy", "a rule"),
    ("token_count", "a count"),
    ("token_usage", "usage figures"),
    ("prompt_token", "an LLM usage field"),
    ("prompt_tokens", "an LLM usage field"),
    ("completion_tokens", "an LLM usage field"),
    ("max_tokens", "a limit"),
    ("total_tokens", "a count"),
    ("tokens", "a tokenizer's output"),
    ("tokenizer", "a different word"),
    ("page_token", "a pagination cursor"),
    ("nextPageToken", "a pagination cursor"),
    ("nextpagetoken", "a pagination cursor, glued"),
    ("secret_name", "a Kubernetes secret's name"),
    ("private_key_path", "where a key file is"),
    ("api_key_id", "the id of a key"),
    ("public_key", "not secret"),
    ("idempotency_key", "castore's own keys"),
    ("cache_key", "not a credential"),
    ("auth_method", "the last word is not a credential"),
    ("author", "a different word"),
    ("secretary", "a different word"),
    ("pwd", "alone, a shell's working directory"),
]


@pytest.mark.parametrize(
    "name", [pytest.param(name, id=f"{name}: {why}") for name, why in REFUSED_NAMES]
)
def test_credential_field_names_are_refused_at_any_depth(store: castore.Store, name: str) -> None:
    """A field whose name means a credential is refused, at the top and inside a list."""
    with _fresh_run(store) as run:
        for result, path in [
            ({name: "v-1"}, f"$.transition.result.{name}"),
            ({"calls": [{"ok": 1}, {name: "v-1"}]}, f"$.transition.result.calls[1].{name}"),
        ]:
            error = _refused(store, lambda result=result: run.commit_step("think", result))
            assert (path, f"field name {name!r} names a credential") == (error.path, error.why)
    assert True is guard.secret_name(name)


@pytest.mark.parametrize(
    "name", [pytest.param(name, id=f"{name}: {why}") for name, why in ALLOWED_NAMES]
)
def test_harmless_fields_named_like_credentials_are_stored(store: castore.Store, name: str) -> None:
    """A credential word qualified as a count, a flag, a cursor or a name is not refused."""
    result = {name: [1, 2, 3], "nested": {name: "on"}}
    with _fresh_run(store) as run:
        run.commit_step("think", result)
    assert result == store.verify(TASK).head.transition.result


@pytest.mark.parametrize("flag", [True, False, None, "", []])
def test_a_credential_field_holding_only_a_flag_or_nothing_is_stored(
    store: castore.Store, flag: object
) -> None:
    """{"password": false} says there is none: flags, null and empty values hold no secret."""
    with _fresh_run(store) as run:
        run.commit_step("think", {"password": flag, "api_key": flag})
    assert {"password": flag, "api_key": flag} == store.verify(TASK).head.transition.result


@pytest.mark.parametrize(
    "name", [pytest.param(name, id=f"{name}: {why}") for name, why in REFUSED_NAMES[:8]]
)
def test_allow_fields_still_vouches_for_a_credential_name(store: castore.Store, name: str) -> None:
    """allow_fields (by key or by full path) lets a credential-named field through."""
    for allow in ([name], [f"$.transition.result.{name}"]):
        task_id = f"vouched-{len(allow[0])}"
        with store.start(task_id, PLAN, allow_fields=allow) as run:
            run.commit_step("think", {name: "demo"})
        assert {name: "demo"} == store.verify(task_id).head.transition.result


# -- look-alikes that are not secrets -------------------------------------------------------------

HARMLESS_VALUES = [
    ("short-sk", "sk-1234", "too short for a key"),
    ("npm-command", "npm_config_cache=/tmp/npm", "an npm setting, not npm_ + 36"),
    ("gh-prefix-prose", "see ghp_ tokens in the docs", "a prefix without a token"),
    ("glpat-short", "glpat-short", "fewer than 20 characters"),
    ("eyJ-alone", "eyJhbGciOiJIUzI1NiJ9", "a JWT header without a payload"),
    ("bearer-prose", "Bearer of good news", "prose"),
    ("basic-prose", "Basic information about the order", "prose"),
    ("url-user-only", "https://ana@example.com/u", "a user without a password"),
    ("url-port", "https://example.com:8443/x", "a port is not a password"),
    ("hex-digest", "blake3:" + "ab" * 32, "a digest"),
    ("castore-key", "cas-0123456789abcdef0123456789abcdef01234567", "an idempotency key"),
    ("uuid", "6f1c2a9e-3b7d-4c1e-9f20-8a7b6c5d4e3f", "an id"),
    ("aws-arn", "arn:aws:s3:::my-bucket/key", "an ARN names, it does not authenticate"),
    ("ssh-public", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB", "a public key"),
]


@pytest.mark.parametrize(
    "value", [pytest.param(value, id=f"{name}: {why}") for name, value, why in HARMLESS_VALUES]
)
def test_values_that_only_resemble_credentials_are_stored(store: castore.Store, value: str) -> None:
    """Prefixes, prose, public keys, ids and digests pass, as values and as keys."""
    result = {"value": value, "by": {value: 1}}
    with _fresh_run(store) as run:
        run.commit_step("think", result)
    assert result == store.verify(TASK).head.transition.result


def test_every_value_shape_is_named_in_the_error() -> None:
    """Each row of the table is recognised by the shape it is listed under (no row passes
    only because another pattern happens to match it)."""
    assert [(n, label) for n, _, label in SECRET_VALUES] == [
        (n, guard.secret_value(value)) for n, value, _ in SECRET_VALUES
    ]


def _deep(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = {"level": [value]}
    return value


def test_a_key_deep_inside_a_result_is_scanned(store: castore.Store) -> None:
    """A credential key 30 levels down is found and named by its path."""
    token = SECRET_VALUES[0][1]
    with _fresh_run(store) as run:
        error = _refused(store, lambda: run.commit_step("think", _deep({token: 1}, 30)))
    assert error.path.endswith(".level[0]." + token[:4] + "…")
