"""What a snapshot may hold: credentials are refused (by field name and by value shape) and
oversized snapshots are refused, each leaving the store byte-identical; blobs carry big values."""

from __future__ import annotations

import contextlib
import datetime
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import tree_snapshot

import castore

TASK = "agent-1"
PLAN = castore.Plan.build("agent", "think", castore.effect("post", "think"), "report")
SERVICE = castore.Service("forum")

SECRET_NAMES = [
    "password",
    "api_key",
    "Authorization",
    "client_secret",
    "private_key",
    "X-Api-Key",
    "access_token",
    "refresh_token",
    "db_password",
    "token",
    "credentials",
]
SECRET_VALUES = {
    "pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\n-----END RSA PRIVATE KEY-----",
    "bearer": "Bearer abc.def.ghi123456",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "github": "ghp_" + "a1B2c3D4e5" * 4,
    "slack": "xoxb-1234567890-abcdefghijkl",
    "stripe": "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "jwt": (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    ),
    "url": "postgres://admin:hunter2@db.internal:5432/app",
}


def _open(store: castore.Store, **options: Any) -> castore.Run:
    return store.start(TASK, PLAN, **options)


def _refused(
    store: castore.Store, write: Callable[[], object], path: str | None = None
) -> castore.SecretInPayloadError:
    """Run `write`, expect SecretInPayloadError and a byte-identical store."""
    before = tree_snapshot(store.root)
    with pytest.raises(castore.SecretInPayloadError) as caught:
        write()
    assert before == tree_snapshot(store.root)
    if path is not None:
        assert path == caught.value.path
    assert "checkpoints must not hold credentials" in str(caught.value)
    assert isinstance(caught.value, castore.PayloadError)
    return caught.value


# -- secrets by field name -------------------------------------------------------------------------


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_field_names_in_a_result_are_refused(store: castore.Store, name: str) -> None:
    """A step result with a credential-named field is refused; nothing is written."""
    with _open(store) as run:
        error = _refused(
            store,
            lambda: run.commit_step("think", {"request": {name: "hunter2-value"}}),
            f"$.transition.result.request.{name}",
        )
        assert f"field name {name!r} names a credential" == error.why
        assert 0 == run.head.seq
    assert 0 == store.verify(TASK).head.seq


@pytest.mark.parametrize("name", ["aws_secret_access_key", "api_token", "github_token"])
def test_common_credential_field_names_are_refused(store: castore.Store, name: str) -> None:
    """Widely used credential field names (AWS, generic API tokens) are refused too."""
    with _open(store) as run:
        _refused(
            store,
            lambda: run.commit_step("think", {name: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}),
        )


def test_empty_credential_fields_hold_no_secret(store: castore.Store) -> None:
    """A credential-named field that is empty or None holds nothing and is accepted."""
    with _open(store) as run:
        run.commit_step("think", {"password": "", "api_key": None, "token": []})
        assert {"password": "", "api_key": None, "token": []} == run.result("think")


# -- secrets by value ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", list(SECRET_VALUES.values()), ids=list(SECRET_VALUES))
def test_secret_values_in_a_result_are_refused(store: castore.Store, value: str) -> None:
    """A result value shaped like a credential is refused wherever it is nested."""
    with _open(store) as run:
        _refused(
            store,
            lambda: run.commit_step("think", {"notes": ["ok", value]}),
            "$.transition.result.notes[1]",
        )
        _refused(store, lambda: run.commit_step("think", value), "$.transition.result")


@pytest.mark.parametrize("value", list(SECRET_VALUES.values()), ids=list(SECRET_VALUES))
def test_secret_values_inside_text_are_refused(store: castore.Store, value: str) -> None:
    """A credential quoted inside a longer text (a log line, a header dump) is refused too."""
    with _open(store) as run:
        _refused(
            store,
            lambda: run.commit_step("think", {"log": f"sent Authorization: {value} upstream"}),
            "$.transition.result.log",
        )


class _LeaveBlock(Exception):
    """Raised to leave an effect block after the check inside it."""


def _confirm_refused(store: castore.Store, run: castore.Run, receipt: str) -> None:
    """Inside the effect block: confirming with `receipt` is refused and writes nothing."""
    with contextlib.suppress(_LeaveBlock), run.effect("post", SERVICE) as call:
        _refused(store, lambda: call.confirm(receipt), "$.transition.receipt")
        raise _LeaveBlock


@pytest.mark.parametrize("value", list(SECRET_VALUES.values()), ids=list(SECRET_VALUES))
def test_secret_receipts_are_refused(store: castore.Store, value: str) -> None:
    """call.confirm with a credential-shaped receipt is refused; the effect stays SUBMITTED."""
    with _open(store) as run:
        run.commit_step("think", "plan")
        _confirm_refused(store, run, value)
        assert castore.EffectState.SUBMITTED == run.head.effect("post").state


def _time_out(key: str) -> str:
    raise TimeoutError(f"no answer for {key}")


def test_a_person_cannot_resolve_with_a_secret_receipt(store: castore.Store) -> None:
    """store.resolve with a credential-shaped receipt is refused; the store is unchanged."""
    with _open(store) as run:
        run.commit_step("think", "plan")
        with pytest.raises(TimeoutError, match="no answer"):
            run.perform("post", SERVICE, _time_out)
    _refused(
        store,
        lambda: store.resolve(TASK, "post", receipt=SECRET_VALUES["stripe"], who="ana@ops"),
    )


def test_secrets_in_plan_meta_are_refused(store: castore.Store) -> None:
    """A plan whose meta holds a credential (by name or by value) is refused; no task appears."""
    by_name = castore.Plan.build("agent", "think", api_key="plain-looking")
    by_value = castore.Plan.build("agent", "think", endpoint=SECRET_VALUES["url"])
    _refused(store, lambda: store.start(TASK, by_name), "$.meta.api_key")
    _refused(store, lambda: store.start(TASK, by_value), "$.meta.endpoint")
    _refused(store, lambda: store.put_plan(by_value), "$.meta.endpoint")
    assert [] == store.tasks()


def test_secrets_in_blobs_are_refused(store: castore.Store) -> None:
    """put_blob refuses credential-named fields and credential-shaped values."""
    _refused(store, lambda: store.put_blob({"rows": [{"password": "x1"}]}), "$.rows[0].password")
    _refused(store, lambda: store.put_blob(["a", SECRET_VALUES["jwt"]]), "$[1]")


# -- allow_fields ----------------------------------------------------------------------------------


def test_allow_fields_lets_a_named_field_through(store: castore.Store) -> None:
    """allow_fields vouches for one field (by name or by full path); others are still refused."""
    with _open(store, allow_fields=["api_key", "$.transition.result.token"]) as run:
        run.commit_step("think", {"api_key": "demo-public-key", "token": "not-a-secret"})
        assert {"api_key": "demo-public-key", "token": "not-a-secret"} == run.result("think")
        run.perform("post", SERVICE, lambda key: "post-1")
        _refused(store, lambda: run.commit_step("report", {"password": "x1"}))
        _refused(store, lambda: run.commit_step("report", {"nested": {"token": "y2"}}))
    with store.resume(TASK, PLAN) as run:  # reading needs no allowance
        assert "demo-public-key" == run.result("think")["api_key"]


def test_allow_fields_on_put_blob(store: castore.Store) -> None:
    """put_blob(..., allow_fields=...) stores a vouched-for field."""
    ref = store.put_blob({"session_id": "s-123"}, allow_fields=["session_id"])
    assert {"session_id": "s-123"} == store.get_blob(ref)


# -- look-alikes that are not secrets --------------------------------------------------------------

AGENT_FIELDS = {
    "prompt_tokens": 12,
    "completion_tokens": 30,
    "total_tokens": 42,
    "max_tokens": 4096,
    "token_count": 3,
    "tokens": ["a", "b"],
    "tokenizer": "cl100k",
    "author": "ana",
    "keyboard": "us",
    "idempotency_key": "cas-0123456789abcdef",
    "cache_key": "k-1",
    "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB",
    "page_token": "CAESBggDEAEYAQ",
    "passage": "the quick brown fox",
    "homepage": "https://example.com:8443/x",
    "contact": "ana@example.com",
    "profile": "https://ana@example.com/u",
    "digest": "blake3:" + "ab" * 32,
    "message": "Bearer of good news",
}


def test_common_agent_fields_are_not_secrets(store: castore.Store) -> None:
    """Token counts, keys that are not credentials and ordinary text pass the guard."""
    with _open(store) as run:
        run.commit_step("think", AGENT_FIELDS)
        assert AGENT_FIELDS == run.result("think")


@pytest.mark.parametrize(
    "text", ["Basic information about the order", "Token accounting: prompt=12, completion=30"]
)
def test_prose_starting_with_basic_or_token_is_not_a_secret(
    store: castore.Store, text: str
) -> None:
    """An ordinary sentence that happens to start with 'Basic' or 'Token' is not a credential."""
    with _open(store) as run:
        run.commit_step("think", {"summary": text})
        assert text == run.result("think")["summary"]


# -- the size budget -------------------------------------------------------------------------------


def test_oversized_snapshot_is_refused_and_blob_ref_works(store: castore.Store) -> None:
    """Over 64 KiB: SnapshotTooLargeError naming store.put_blob; a BlobRef then stores it."""
    big = {"rows": [f"row {n:06d}" for n in range(8000)]}
    with _open(store) as run:
        before = tree_snapshot(store.root)
        with pytest.raises(castore.SnapshotTooLargeError) as caught:
            run.commit_step("think", big)
        assert before == tree_snapshot(store.root)
        error = caught.value
        assert (64 * 1024, "result") == (error.budget, error.biggest)
        assert error.size > error.budget
        assert "store.put_blob(value)" in str(error)
        assert isinstance(error, castore.PayloadError)
        ref = store.put_blob(big)
        assert isinstance(ref, castore.BlobRef)
        run.commit_step("think", ref)
        assert big == run.result("think")
    with store.resume(TASK, PLAN) as run:
        assert big == run.result("think")
        assert ref.blob == run.outcome("think").result_ref


def test_snapshot_budget_is_configurable(tmp_path: Any) -> None:
    """Store(..., snapshot_budget=N) refuses snapshots over N bytes."""
    store = castore.Store.init(tmp_path / "small", snapshot_budget=2048)
    with _open(store) as run:
        run.commit_step("think", "x" * 1000)
        run.perform("post", SERVICE, lambda key: "post-1")
        with pytest.raises(castore.SnapshotTooLargeError) as caught:
            run.commit_step("report", "x" * 3000)
        assert 2048 == caught.value.budget


def test_big_receipt_is_refused(store: castore.Store) -> None:
    """A receipt is a reference, not a copy: one over the budget is refused."""
    with _open(store) as run:
        run.commit_step("think", "plan")
        with pytest.raises(castore.SnapshotTooLargeError) as caught:
            run.perform("post", SERVICE, lambda key: " ".join(["rcpt"] * 15_000))
        assert "receipt" == caught.value.biggest
        assert castore.EffectState.SUBMITTED == run.head.effect("post").state


def test_checking_a_long_value_costs_linear_time(store: castore.Store) -> None:
    """A 60,000-character value without spaces is checked for secrets in well under a second."""
    value = "0123456789abcdef" * 3750  # e.g. a long hex digest list written without spaces
    with _open(store) as run:
        started = time.perf_counter()
        run.commit_step("think", value)
        elapsed = time.perf_counter() - started
    assert value == store.verify(TASK).head.transition.result
    assert elapsed < 1.0, f"commit_step of a 60 KB value took {elapsed:.2f} s"


@pytest.mark.parametrize(
    "put",
    [
        lambda store, run: store.put_blob(b"%PDF-1.7 raw bytes"),
        lambda store, run: run.commit_step("think", b"%PDF-1.7 raw bytes"),
        lambda store, run: run.commit_step("think", {"pdf": bytearray(b"%PDF")}),
    ],
    ids=["put_blob", "commit_step", "nested"],
)
def test_bytes_where_a_value_belongs_names_put_raw(
    store: castore.Store, put: Callable[[castore.Store, castore.Run], object]
) -> None:
    """Bytes given as a value are refused with advice naming store.put_raw, which stores them."""
    with _open(store) as run:
        with pytest.raises(castore.EncodingError) as caught:
            put(store, run)
        assert "store.put_raw(data)" in str(caught.value)
        assert "as a blob" not in str(caught.value)
        run.commit_step("think", store.put_raw(b"%PDF-1.7 raw bytes"))
        assert b"%PDF-1.7 raw bytes" == run.result("think")


def test_too_large_advice_names_put_raw_for_bytes(store: castore.Store) -> None:
    """A snapshot over its budget is told both ways of storing by reference: put_blob, put_raw."""
    with _open(store) as run, pytest.raises(castore.SnapshotTooLargeError) as caught:
        run.commit_step("think", "x" * (70 * 1024))
    assert "store.put_blob(value)" in str(caught.value)
    assert "store.put_raw(data)" in str(caught.value)


@pytest.mark.parametrize(
    ("result", "told"),
    [
        (
            {"when": datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)},
            "the result's field 'when' is a datetime, which is not part of castore's data "
            "model (at $.transition.result.when)",
        ),
        (
            {"counts": {1: "one"}},
            "the result's field 'counts' has the key 1, of type int: keys must be str "
            "(at $.transition.result.counts)",
        ),
        (
            {"scores": [0.5, math.nan]},
            "the result's field 'scores[1]' is nan, not a finite number "
            "(at $.transition.result.scores[1])",
        ),
        (math.inf, "the result is inf, not a finite number (at $.transition.result)"),
    ],
    ids=["datetime", "int-key", "nan", "whole"],
)
def test_a_result_outside_the_data_model_names_the_step_and_field(
    store: castore.Store, result: object, told: str
) -> None:
    """A step's result castore cannot encode names the task, the step and the result's
    field, with the record path as the detail; nothing is committed."""
    with _open(store) as run:
        seq = run.head.seq
        with pytest.raises(castore.EncodingError) as caught:
            run.commit_step("think", result)
        assert f"step 'think' of task '{TASK}': {told}; use only None" in str(caught.value)
        assert (seq, caught.value.path) == (run.head.seq, told.rpartition("(at ")[2][:-1])
