"""`castore doctor s3://...` (issue 25 item 4): it races conditional PUTs against the endpoint,
checks read- and list-after-write, records its verdict in the store, and a store whose
endpoint failed is refused. The unfaithful endpoint is real: a proxy in front of moto that
strips If-None-Match from every request (tests/s3proxy.py), so every PUT overwrites.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from helpers import cli
from s3proxy import FaultProxy
from s3servers import S3Endpoint

import castore
import castore.cli.doctor
import castore.doctor.s3
from castore.doctor.s3 import run_s3_doctor
from castore.errors import UnsafeEndpointError
from castore.medium.s3 import VERDICT_KEY, S3Medium

ROUNDS = "10"
REQUIRED = ["exclusive-create", "exclusive-create-race", "read-after-write", "list-after-write"]


@pytest.fixture
def ignoring(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A proxy that makes the endpoint ignore If-None-Match, and the environment set to it."""
    if s3.engine != "moto":
        pytest.skip("RGW checks request signatures: a signed header cannot be stripped in flight")
    with FaultProxy(s3.url, strip=("if-none-match",)) as proxy:
        for name, value in s3.env(proxy.url).items():
            monkeypatch.setenv(name, value)
        yield proxy


def doctor(capsys: pytest.CaptureFixture[str], url: str) -> tuple[int, dict[str, str]]:
    code, out, _ = cli(capsys, "doctor", url, "--rounds", ROUNDS, "--json")
    report = json.loads(out)
    assert "doctor" == report["type"]
    return code, {check["name"]: check["verdict"] for check in report["checks"]}


def recorded(url: str) -> dict[str, object]:
    record: dict[str, object] = json.loads(S3Medium.from_url(url).read(VERDICT_KEY))
    return record


def test_doctor_passes_a_faithful_endpoint_and_records_what_it_found(
    s3: S3Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    url = s3.new_bucket()
    castore.Store.init(url)
    code, verdicts = doctor(capsys, url)
    assert (0, ["ok"] * len(REQUIRED)) == (code, [verdicts[name] for name in REQUIRED])
    record = recorded(url)
    assert (True, "castore doctor", int(ROUNDS)) == (
        record["exclusive_create"],
        record["by"],
        record["rounds"],
    )
    # Its scratch keys are gone: the store holds what it held before, and opens.
    assert [] == [name for name in S3Medium.from_url(url).names("") if name.startswith(".castore")]
    castore.Store.open(url)


def test_a_few_rounds_are_not_called_safe_and_the_bound_is_said(
    s3: S3Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42, item 12: 10 rounds cannot catch a race of 1 in 200 rounds (stock moto's)."""
    url = s3.new_bucket()
    castore.Store.init(url)
    code, out, _ = cli(capsys, "doctor", url, "--rounds", ROUNDS)
    assert 0 == code
    assert "castore is safe here" not in out
    assert "no check failed in 10 rounds, too few to call castore safe here" in out
    assert "a race rarer than 1 in 3 rounds could have slipped through (95% confidence)" in out
    castore.Store.open(url)  # what was found is recorded: the store opens


def test_doctor_finds_an_endpoint_that_ignores_if_none_match_and_the_store_is_refused(
    s3: S3Endpoint, ignoring: FaultProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the stripping proxy: both create checks fail, the verdict says unsafe, and
    opening the store (even straight at the faithful server) is refused until the doctor,
    run against the faithful server, records that it is safe."""
    url = s3.new_bucket()
    castore.Store.init(url, **s3.options())  # made at the faithful server, opened through the proxy
    code, verdicts = doctor(capsys, url)
    assert 0 != code
    assert ("fail", "fail") == (verdicts["exclusive-create"], verdicts["exclusive-create-race"])
    assert False is recorded(url)["exclusive_create"]
    assert ignoring.log  # the doctor's requests went through the proxy
    with pytest.raises(UnsafeEndpointError, match="castore doctor"):
        castore.Store.open(url, **s3.options())
    report = run_s3_doctor(url, rounds=int(ROUNDS), **s3.options())
    assert True is report.safe
    castore.Store.open(url, **s3.options())


def test_init_refuses_an_endpoint_that_ignores_if_none_match(
    s3: S3Endpoint, ignoring: FaultProxy
) -> None:
    """An endpoint whose second exclusive create succeeds gets no store: init records the
    verdict, writes no marker, and says so."""
    url = s3.new_bucket()
    with pytest.raises(UnsafeEndpointError, match="castore doctor"):
        castore.Store.init(url)
    medium = S3Medium.from_url(url, **s3.options())
    assert (False, False) == (medium.exists("castore.json"), recorded(url)["exclusive_create"])


def test_a_store_without_its_record_is_refused_and_opening_it_writes_nothing(
    s3: S3Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """The record gone (removed by hand): opening refuses, fail-closed, and does not probe
    (a reader may hold read-only keys); the doctor makes a new record, and it opens."""
    url = s3.new_bucket()
    castore.Store.init(url)
    medium = S3Medium.from_url(url)
    medium.remove(VERDICT_KEY)
    before = sorted(medium.names(""))
    with pytest.raises(UnsafeEndpointError, match="no record"):
        castore.Store.open(url)
    assert before == sorted(medium.names(""))
    assert 0 == doctor(capsys, url)[0]
    castore.Store.open(url)


def test_the_cli_default_of_rounds_is_the_doctors() -> None:
    """The CLI keeps its own copy (its --help must not import boto3): the two agree."""
    assert castore.doctor.s3.ROUNDS == castore.cli.doctor.S3_ROUNDS
