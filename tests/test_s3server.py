"""The test S3 server helper: the ``TIERDATA_TEST_S3_ENDPOINT`` path (an external server).

The session's real server (SeaweedFS here) stands in for the user's MinIO from
``docker compose up -d minio``: the helper must use it as is, with the keys from the
environment, and must never stop it.
"""

from __future__ import annotations

import uuid

import pytest

from tests.s3server import S3Endpoint, start_s3_server


def _external_env(server: S3Endpoint, **extra: str) -> dict[str, str]:
    return {
        "TIERDATA_TEST_S3_ENDPOINT": server.url + "/",
        "TIERDATA_TEST_S3_ACCESS_KEY": server.access_key,
        "TIERDATA_TEST_S3_SECRET_KEY": server.secret_key,
        **extra,
    }


def test_external_endpoint_is_used_as_is_and_never_stopped(s3_server: S3Endpoint) -> None:
    external = start_s3_server(_external_env(s3_server))
    assert external.endpoint.kind == "external"
    assert external.endpoint.url == s3_server.url  # the trailing slash is dropped
    assert external.process is None
    url = external.endpoint.unique_url()
    with external.endpoint.store(url) as store:
        store.put("probe", b"through the external endpoint")
    external.stop()
    # Stopping the helper's handle leaves the server (and the data) in place.
    with s3_server.store(url) as store:
        assert store.get("probe") == b"through the external endpoint"


def test_external_endpoint_keys_fall_back_to_the_aws_variables(s3_server: S3Endpoint) -> None:
    env = {
        "TIERDATA_TEST_S3_ENDPOINT": s3_server.url,
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
    }
    external = start_s3_server(env)
    key = f"probe-{uuid.uuid4().hex[:8]}"
    with external.endpoint.store(external.endpoint.unique_url()) as store:
        store.put(key, b"x")
        assert store.exists(key)


def test_external_endpoint_with_wrong_keys_is_refused(s3_server: S3Endpoint) -> None:
    env = _external_env(s3_server, TIERDATA_TEST_S3_SECRET_KEY="not-the-secret")
    with pytest.raises(RuntimeError, match="refused the keys"):
        start_s3_server(env)
