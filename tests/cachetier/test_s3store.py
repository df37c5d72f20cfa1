"""What only the S3 backend has: settings from the AWS conventions, retries, error
translation, multipart, fork/pickle safety. The shared behaviour is in the conformance suite.

Faults are real: a closed port, and a loopback TCP proxy in front of the real server that
drops connections, answers ``503 SlowDown``, or forwards a request and loses the reply.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachetier.errors import (
    BadInputError,
    ConflictError,
    NotFoundError,
    StoreUnavailableError,
    TierdataError,
)
from cachetier.registry import open_store
from cachetier.s3store import S3Options, S3Store, parse_s3_url, resolve_s3_options
from tests.s3server import S3Endpoint

FAST_RETRIES = {"max_attempts": 4, "backoff_base": 0.02, "backoff_cap": 0.1}


# --------------------------------------------------------------------------- a faulty proxy


class FaultProxy:
    """Forwards loopback TCP to ``target``, except that its first ``faults`` connections
    are broken as ``mode`` says: ``reset`` (closed unanswered), ``slowdown`` (an S3
    ``503 SlowDown`` reply) or ``lose-reply`` (the request reaches the server, the reply
    is dropped)."""

    def __init__(self, target_port: int, mode: str, faults: int):
        self.target_port, self.mode, self.faults = target_port, mode, faults
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            broken = self.connections <= self.faults
            handler = getattr(self, f"_{self.mode.replace('-', '_')}") if broken else self._forward
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    def _reset(self, conn: socket.socket) -> None:
        conn.close()

    def _slowdown(self, conn: socket.socket) -> None:
        _read_head(conn)
        body = b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>reduce your rate</Message></Error>"
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        conn.sendall(head.encode() + body)
        conn.close()

    def _lose_reply(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        threading.Thread(target=_pipe, args=(conn, upstream), daemon=True).start()
        upstream.recv(1)  # the server has answered: the request was applied
        for s in (upstream, conn):
            s.shutdown(socket.SHUT_RDWR)  # wakes the pipe thread; the client sees EOF at once
            s.close()

    def _forward(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        threading.Thread(target=_pipe, args=(conn, upstream), daemon=True).start()
        _pipe(upstream, conn)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(1 << 16):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture
def proxies() -> Iterator[list[FaultProxy]]:
    made: list[FaultProxy] = []
    yield made
    for proxy in made:
        proxy.close()


def _through_proxy(
    s3_server: S3Endpoint, url: str, proxies: list[FaultProxy], mode: str, faults: int, **tuning: object
) -> tuple[S3Store, FaultProxy]:
    """A store for ``url`` whose requests pass a new FaultProxy in front of the server."""
    port = int(s3_server.url.rsplit(":", 1)[1])
    proxy = FaultProxy(port, mode, faults)
    proxies.append(proxy)
    options = s3_server.options(endpoint=f"http://127.0.0.1:{proxy.port}", **tuning)
    return S3Store.from_url(url, options=options), proxy


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


# --------------------------------------------------------------------------- retries


def test_unreachable_endpoint_fails_clearly_after_bounded_retries(caplog: pytest.LogCaptureFixture) -> None:
    port = _closed_port()
    options = S3Options(endpoint=f"http://127.0.0.1:{port}", access_key="ak", secret_key="sk", **FAST_RETRIES)
    store = S3Store("some-bucket", "repo", options=options)
    operations = {
        "get": lambda: store.get("objects/ab/cd"),
        "put": lambda: store.put("objects/ab/cd", b"x"),
        "exists": lambda: store.exists("objects/ab/cd"),
        "list": lambda: list(store.list("objects/")),
        "cas": lambda: store.compare_and_swap("objects/ab/cd", b"x", None),
    }
    for name, operation in operations.items():
        caplog.clear()
        started = time.monotonic()
        with (
            caplog.at_level(logging.WARNING, logger="cachetier.s3store"),
            pytest.raises(StoreUnavailableError) as info,
        ):
            operation()
        elapsed = time.monotonic() - started
        message = str(info.value)
        assert f"http://127.0.0.1:{port}" in message, name
        assert "s3://some-bucket/repo/objects/" in message, name
        assert "after 4 attempts" in message, name
        assert isinstance(info.value, OSError)
        assert len([r for r in caplog.records if "retrying" in r.getMessage()]) == 3, name
        assert elapsed < 2.0, f"{name} took {elapsed:.1f} s"


def test_default_retry_budget_is_bounded() -> None:
    store = S3Store("some-bucket", options=S3Options(endpoint=f"http://127.0.0.1:{_closed_port()}"))
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        store.get("k")
    assert time.monotonic() - started < 5.0


def test_dropped_connections_are_retried(
    s3_server: S3Endpoint, s3_url: str, s3_store: S3Store, proxies: list[FaultProxy], caplog
) -> None:
    s3_store.put("k", b"value")
    store, proxy = _through_proxy(s3_server, s3_url, proxies, "reset", faults=2)
    with caplog.at_level(logging.WARNING, logger="cachetier.s3store"):
        assert store.get("k") == b"value"
    assert proxy.connections == 3
    assert len([r for r in caplog.records if "retrying" in r.getMessage()]) == 2


def test_slowdown_is_retried_then_succeeds(
    s3_server: S3Endpoint, s3_url: str, s3_store: S3Store, proxies: list[FaultProxy]
) -> None:
    s3_store.put("k", b"value")
    store, proxy = _through_proxy(s3_server, s3_url, proxies, "slowdown", faults=2)
    assert store.get("k") == b"value"
    assert proxy.connections == 3


def test_endless_slowdown_becomes_store_unavailable(
    s3_server: S3Endpoint, s3_url: str, proxies: list[FaultProxy]
) -> None:
    store, proxy = _through_proxy(s3_server, s3_url, proxies, "slowdown", faults=1000, **FAST_RETRIES)
    with pytest.raises(StoreUnavailableError) as info:
        store.get("k")
    assert "SlowDown" in str(info.value)
    assert proxy.connections == 4


def test_cas_whose_reply_was_lost_still_succeeds(
    s3_server: S3Endpoint, s3_url: str, s3_store: S3Store, proxies: list[FaultProxy]
) -> None:
    store, proxy = _through_proxy(s3_server, s3_url, proxies, "lose-reply", faults=1)
    token = store.compare_and_swap("refs/heads/main", b"v1", None)
    assert proxy.connections == 2  # the first try landed, its reply was lost, the retry got 412
    assert s3_store.read_versioned("refs/heads/main").token == token
    with pytest.raises(ConflictError):
        store.compare_and_swap("refs/heads/main", b"other", None)


# --------------------------------------------------------------------------- errors and secrets


def test_wrong_secret_is_access_denied_and_never_printed(s3_server: S3Endpoint, s3_url: str, caplog) -> None:
    secret = "wrong-secret-" + uuid.uuid4().hex
    store = s3_server.store(s3_url, secret_key=secret)
    with caplog.at_level(logging.DEBUG), pytest.raises(TierdataError) as info:
        store.get("k")
    error = info.value
    assert not isinstance(error, NotFoundError | StoreUnavailableError)
    assert "denied" in str(error)
    assert "AWS_ACCESS_KEY_ID" in str(error)
    for text in (str(error), repr(error), repr(store), str(store), repr(store.options), caplog.text):
        assert secret not in text
        assert s3_server.secret_key not in text


def test_anonymous_access_is_denied_with_a_hint(s3_server: S3Endpoint, s3_url: str) -> None:
    store = S3Store.from_url(s3_url, options=S3Options(endpoint=s3_server.url, region=s3_server.region))
    with pytest.raises(TierdataError, match="no S3 credentials were found"):
        store.put("k", b"x")


def test_missing_bucket_is_not_found_and_ensure_bucket_creates_it(s3_server: S3Endpoint) -> None:
    url = f"s3://tdt-{uuid.uuid4().hex[:20]}/repo"
    store = s3_server.store(url)
    with pytest.raises(NotFoundError) as info:
        store.get("repo.json")
    assert "dataset init" in str(info.value)
    assert store.ensure_bucket() is True
    assert store.ensure_bucket() is False
    store.put("repo.json", b"{}")
    assert store.get("repo.json") == b"{}"


def test_big_values_go_up_in_parts(s3_server: S3Endpoint, s3_store: S3Store, tmp_path: Path) -> None:
    data = os.urandom(20 << 20)
    (tmp_path / "f").write_bytes(data)
    s3_store.put_file("file", tmp_path / "f")
    s3_store.put("bytes", data)
    client = s3_server.minio_client()
    for key in ("file", "bytes"):
        stat = client.stat_object(s3_store.bucket, f"{s3_store.prefix}/{key}")
        assert stat.etag.endswith("-3"), stat.etag  # 8 MiB parts: a multipart upload
        assert s3_store.get(key) == data


def test_store_survives_pickle_and_fork(s3_store: S3Store) -> None:
    s3_store.put("k", b"value")
    clone = pickle.loads(pickle.dumps(s3_store))
    assert clone.url == s3_store.url
    assert clone.get("k") == b"value"
    pid = os.fork()
    if pid == 0:  # the child uses the parent's store object: it must not share its sockets
        try:
            ok = s3_store.get("k") == b"value"
            s3_store.put("from-child", b"hi")
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert s3_store.get("from-child") == b"hi"
    assert s3_store.get("k") == b"value"


def test_open_store_reads_the_aws_environment(s3_env: dict[str, str], s3_url: str) -> None:
    with open_store(s3_url) as store:
        assert isinstance(store, S3Store)
        assert store.endpoint == s3_env["AWS_ENDPOINT_URL"]
        store.put("x", b"1")
        assert store.get("x") == b"1"


# --------------------------------------------------------------------------- settings


def test_settings_precedence_explicit_then_environment_then_profile(tmp_path: Path) -> None:
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n"
        "[work]\naws_access_key_id = WORKKEY\naws_secret_access_key = worksecret\naws_session_token = tok\n"
    )
    (tmp_path / ".aws" / "config").write_text(
        "[default]\nregion = eu-west-1\n[profile work]\nregion = us-west-2\nendpoint_url = http://work:9000\n"
    )
    home = {"HOME": str(tmp_path)}

    opts = resolve_s3_options(environ=home)
    assert (opts.access_key, opts.secret_key, opts.region, opts.endpoint) == (
        "FILEKEY",
        "filesecret",
        "eu-west-1",
        None,
    )

    opts = resolve_s3_options(environ={**home, "AWS_PROFILE": "work"})
    assert (opts.access_key, opts.session_token, opts.region, opts.endpoint) == (
        "WORKKEY",
        "tok",
        "us-west-2",
        "http://work:9000",
    )

    env = {
        **home,
        "AWS_PROFILE": "work",
        "AWS_ACCESS_KEY_ID": "ENVKEY",
        "AWS_SECRET_ACCESS_KEY": "envsecret",
        "AWS_ENDPOINT_URL": "http://generic:1",
        "AWS_ENDPOINT_URL_S3": "http://s3only:2",
        "AWS_DEFAULT_REGION": "ap-south-1",
    }
    opts = resolve_s3_options(environ=env)
    assert (opts.access_key, opts.secret_key, opts.session_token) == ("ENVKEY", "envsecret", None)
    assert (opts.endpoint, opts.region) == ("http://s3only:2", "ap-south-1")

    opts = resolve_s3_options(
        environ=env, endpoint="http://explicit:3", access_key="ARGKEY", secret_key="argsecret", max_attempts=2
    )
    assert (opts.endpoint, opts.access_key, opts.secret_key, opts.max_attempts) == (
        "http://explicit:3",
        "ARGKEY",
        "argsecret",
        2,
    )
    assert "secret" not in repr(opts) and "ARGKEY" not in repr(opts)


def test_settings_errors_name_the_fault(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="profile 'nope' not found"):
        resolve_s3_options(environ={"HOME": str(tmp_path), "AWS_PROFILE": "nope"})
    with pytest.raises(BadInputError, match="AWS_SECRET_ACCESS_KEY"):
        resolve_s3_options(environ={"HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "only-the-key"})
    assert resolve_s3_options(environ={"HOME": str(tmp_path)}) == S3Options()


def test_settings_are_not_read_at_import_or_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://from-env:1")
    store = S3Store.from_url("s3://bucket-a/p", options=S3Options(endpoint="http://given:2"))
    assert store.endpoint == "http://given:2"


@pytest.mark.parametrize(
    "url",
    [
        "s3://",
        "s3://ab/x",
        "s3://Upper/x",
        "s3://under_score/x",
        "file:///x",
        "s3://bucket/a//b",
        "s3://bucket/../x",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(BadInputError):
        parse_s3_url(url)


def test_url_round_trip() -> None:
    assert parse_s3_url("s3://my-bucket/a/b/") == ("my-bucket", "a/b")
    assert parse_s3_url("s3://my-bucket") == ("my-bucket", "")
    store = S3Store("my-bucket", "a/b", options=S3Options(endpoint="http://h:1"))
    assert store.url == "s3://my-bucket/a/b"
    assert repr(store) == "S3Store('s3://my-bucket/a/b')"


def test_raw_client_sees_keys_below_the_prefix(s3_server: S3Endpoint, s3_store: S3Store) -> None:
    s3_store.put("a/b", b"1")
    names = [
        o.object_name
        for o in s3_server.minio_client().list_objects(s3_store.bucket, s3_store.prefix + "/", recursive=True)
    ]
    assert names == [f"{s3_store.prefix}/a/b"]
    s3_server.minio_client().put_object(s3_store.bucket, f"{s3_store.prefix}/raw", io.BytesIO(b"r"), 1)
    assert s3_store.get("raw") == b"r"


def test_public_api_is_frozen() -> None:
    import cachetier.s3store as module

    assert sorted(module.__all__) == ["S3Options", "S3Store", "parse_s3_url", "resolve_s3_options"]
    public = {name for name in vars(S3Store) if not name.startswith("_")}
    assert public == {
        "from_url",
        "supports_cas",
        "get",
        "exists",
        "info",
        "list",
        "get_to_file",
        "read_versioned",
        "put",
        "put_file",
        "delete",
        "touch",
        "compare_and_swap",
        "ensure_bucket",
        "close",
    }
