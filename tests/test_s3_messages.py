"""What a new user of an s3:// store is told (issue 42, items 1 and 2): a missing bucket, an
endpoint that does not answer (which one, and how it was chosen), a wrong secret (in S3's
words, not a file's owner and mode)."""

from __future__ import annotations

import pytest
from helpers import cli
from s3servers import S3Endpoint

import castore
from castore.errors import BucketNotFoundError, StoreIOError
from castore.medium import s3client


def test_a_missing_bucket_is_one_line_naming_it(
    s3: S3Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BucketNotFoundError, match="the bucket 'nosuchbucket-x' does not exist"):
        castore.Store.open("s3://nosuchbucket-x/p")
    for argv in (("status", "--store", "s3://nosuchbucket-x/p"), ("fsck", "s3://nosuchbucket-x/p")):
        code, out, err = cli(capsys, *argv)
        assert code != 0
        assert "nosuchbucket-x" in err
        assert "Traceback" not in out + err


def test_an_endpoint_that_does_not_answer_is_named_with_how_it_was_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(s3client, "ATTEMPTS", 1)
    with pytest.raises(StoreIOError) as failed:
        castore.Store.open(
            "s3://b/p",
            endpoint_url="http://127.0.0.1:9",
            aws_access_key_id="k",
            aws_secret_access_key="s",  # noqa: S106 - no server will check it
            region_name="us-east-1",
            connect_timeout=1.0,
        )
    message = str(failed.value)
    assert "http://127.0.0.1:9" in message
    assert "the endpoint_url option" in message
    assert "owner" not in message


def test_no_endpoint_set_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    assert "no endpoint was set" in s3client._endpoint_source(None)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:7480")
    assert s3client._endpoint_source(None) == "$AWS_ENDPOINT_URL_S3"


def test_a_wrong_secret_is_worded_for_s3(s3: S3Endpoint) -> None:
    if s3.engine == "moto":
        pytest.skip("moto does not check request signatures")
    url = s3.new_bucket()
    castore.Store.init(url)
    options = {**s3.options(), "aws_secret_access_key": "wrong"}
    with pytest.raises(StoreIOError) as failed:
        castore.Store.open(url, **options)
    message = str(failed.value)
    assert "check the access key and secret key" in message
    assert "owner" not in message
    assert "mode" not in message
