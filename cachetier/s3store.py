"""A store in an S3 bucket (AWS S3, MinIO, SeaweedFS, ...) through the ``minio`` client.

Keys live below ``s3://bucket/prefix``: key ``a/b`` is object ``prefix/a/b``.

Settings come from one explicit call, :func:`resolve_s3_options`, which fills what the
caller did not give from the AWS conventions (``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY`` (+
``AWS_SESSION_TOKEN``), ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_PROFILE`` with
``~/.aws/credentials`` and ``~/.aws/config``). Nothing is read at import time.
Precedence: explicit arguments, then environment variables, then the profile files.

Errors are translated at one boundary, :meth:`S3Store._call`:

- connection errors, timeouts, HTTP 500/502/503/504 and ``SlowDown`` are retried with
  exponential backoff and jitter, a bounded number of times, then raise
  :class:`~cachetier.errors.StoreUnavailableError` naming the endpoint and the key;
- ``NoSuchKey`` / ``NoSuchBucket`` raise :class:`~cachetier.errors.NotFoundError`;
- a failed precondition (HTTP 412, or 409 from a concurrent conditional write) raises
  :class:`~cachetier.errors.ConflictError`;
- access denied raises :class:`~cachetier.errors.TierdataError` with a hint on credentials.

Compare-and-swap is a conditional PUT: ``If-Match: "<etag>"`` to replace the value that
:meth:`S3Store.read_versioned` returned (its ETag is the token), ``If-None-Match: *`` to
create a key that must not exist. The server decides atomically, so of two racing writers
exactly one wins. minio's public ``put_object`` turns unknown headers into user metadata
(``X-Amz-Meta-If-Match``), so the conditional PUT goes through the client's lower-level
``_put_object``, which sends headers as given (the conformance suite checks the race).

Threads and fork: one store is safe to share between threads (one urllib3 pool of
``max_connections`` connections). A process that forks gets a fresh client on first use
in the child, so pooled sockets are never shared across processes. Pickling a store
(e.g. into DataLoader workers) carries its options, not its connections.

Credentials never appear in ``repr``, ``str`` or any message: :class:`S3Options` hides
them from ``repr``, and errors name only the endpoint, bucket and key.
"""

from __future__ import annotations

import configparser
import io
import logging
import os
import random
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.client import HTTPException
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlparse

import certifi
import urllib3
from minio import Minio
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError

from cachetier.errors import (
    BadInputError,
    ConflictError,
    NotFoundError,
    StoreUnavailableError,
    TierdataError,
)
from cachetier.store import BytesLike, ObjectInfo, Store, Versioned

__all__ = ["S3Options", "S3Store", "parse_s3_url", "resolve_s3_options"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT_STATUS = frozenset({500, 502, 503, 504})
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "OperationAborted"}
)
_DENIED_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}
)
_CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_MIN_PART_SIZE = 5 << 20
_MAX_PARTS = 10_000
_COPY_BUFFER = 1 << 20
# What the client can raise; anything else (a local file error, a bug) passes through as is.
_BACKEND_ERRORS = (
    MinioException,
    urllib3.exceptions.HTTPError,
    HTTPException,
    ConnectionError,
    TimeoutError,
    ValueError,
)


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, kw_only=True)
class S3Options:
    """Everything an :class:`S3Store` needs besides the bucket: endpoint, keys and tuning.

    ``endpoint`` is a URL (``http://127.0.0.1:9000``); ``None`` means AWS S3. Secrets are
    kept out of ``repr``. Retries: at most ``max_attempts`` tries per operation, sleeping
    ``backoff_base * 2**n`` seconds (capped at ``backoff_cap``, half of it jittered) between.
    """

    endpoint: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    max_attempts: int = 5
    backoff_base: float = 0.2
    backoff_cap: float = 5.0
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    max_connections: int = 32
    part_size: int = 8 << 20
    parallel_uploads: int = 4
    verify_tls: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise BadInputError(f"max_attempts must be >= 1, got {self.max_attempts}", subject="max_attempts")
        if self.part_size < _MIN_PART_SIZE:
            raise BadInputError(
                f"part_size must be at least {_MIN_PART_SIZE} bytes (S3's minimum), got {self.part_size}",
                subject="part_size",
            )
        if (self.access_key is None) != (self.secret_key is None):
            raise BadInputError(
                "an S3 access key needs its secret key and vice versa",
                subject="S3 credentials",
                hint="set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            )

    @property
    def has_credentials(self) -> bool:
        """True when requests are signed (False: anonymous access)."""
        return self.access_key is not None


def resolve_s3_options(
    *,
    endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    session_token: str | None = None,
    region: str | None = None,
    profile: str | None = None,
    environ: Mapping[str, str] | None = None,
    **tuning: Any,
) -> S3Options:
    """Return :class:`S3Options` from the arguments, filling the gaps from the AWS conventions.

    Explicit arguments win; then ``AWS_*`` variables of ``environ`` (default
    ``os.environ``); then the profile (``profile``, ``AWS_PROFILE`` or ``default``) in
    ``~/.aws/credentials`` and ``~/.aws/config`` (``AWS_SHARED_CREDENTIALS_FILE`` and
    ``AWS_CONFIG_FILE`` move them). Credentials are taken as a group from one source.
    ``tuning`` sets the other :class:`S3Options` fields (retries, timeouts, pool size).
    """
    env = os.environ if environ is None else environ
    explicit_profile = profile is not None
    profile = profile or env.get("AWS_PROFILE") or "default"
    files = _read_profile(profile, env, required=explicit_profile or "AWS_PROFILE" in env)

    if access_key is None and secret_key is None:
        if env.get("AWS_ACCESS_KEY_ID"):
            access_key, secret_key = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
            session_token = session_token or env.get("AWS_SESSION_TOKEN") or None
        elif files.get("aws_access_key_id"):
            access_key, secret_key = files.get("aws_access_key_id"), files.get("aws_secret_access_key")
            session_token = session_token or files.get("aws_session_token") or None
    endpoint = (
        endpoint
        or env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL")
        or files.get("endpoint_url")
        or None
    )
    region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or files.get("region") or None
    return S3Options(
        endpoint=endpoint,
        access_key=access_key or None,
        secret_key=secret_key or None,
        session_token=session_token,
        region=region,
        **tuning,
    )


def _read_profile(profile: str, env: Mapping[str, str], *, required: bool) -> dict[str, str]:
    """Merge the ``profile`` sections of the AWS config and credentials files (credentials win)."""
    home = Path(env.get("HOME") or Path.home())
    config_path = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config").expanduser()
    creds_path = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials").expanduser()
    config_section = profile if profile == "default" else f"profile {profile}"
    merged: dict[str, str] = {}
    found = False
    for path, section in ((config_path, config_section), (creds_path, profile)):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError) as e:
            raise BadInputError(f"cannot parse AWS settings file: {e}", subject=str(path)) from e
        if parser.has_section(section):
            found = True
            merged.update({k: v.strip() for k, v in parser.items(section) if v.strip()})
    if required and not found:
        raise BadInputError(
            f"AWS profile {profile!r} not found in {creds_path} or {config_path}",
            subject=f"profile {profile}",
            hint="fix AWS_PROFILE or add the profile to ~/.aws/credentials",
        )
    return merged


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split ``s3://bucket/prefix`` into ``(bucket, prefix)``; the prefix has no edge slashes."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise BadInputError("not an s3://bucket/prefix URL", subject=url)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    if not 3 <= len(bucket) <= 63 or not all(c.islower() or c.isdigit() or c in ".-" for c in bucket):
        raise BadInputError(
            f"invalid bucket name {bucket!r}",
            subject=url,
            hint="S3 bucket names have 3-63 characters: lowercase letters, digits, '.' and '-'",
        )
    if "//" in prefix or any(p in (".", "..") for p in prefix.split("/")):
        raise BadInputError(f"invalid key prefix {prefix!r}", subject=url)
    return bucket, prefix


# --------------------------------------------------------------------------- the store


class S3Store(Store):
    """Keys below ``s3://bucket/prefix`` on an S3-compatible server; see the module docstring."""

    def __init__(self, bucket: str, prefix: str = "", *, options: S3Options | None = None):
        self.bucket, self.prefix = parse_s3_url(f"s3://{bucket}/{prefix}")
        self.options = options or S3Options()
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._root = f"{self.prefix}/" if self.prefix else ""
        endpoint = self.options.endpoint or "https://s3.amazonaws.com"
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/"):
            raise BadInputError(
                "S3 endpoint must be http(s)://host[:port] without a path",
                subject=f"endpoint {parsed.scheme}://{parsed.hostname}{parsed.path}",
            )
        self._secure = parsed.scheme == "https"
        self._hostport = parsed.hostname + (f":{parsed.port}" if parsed.port else "")
        #: The endpoint as messages show it (never with credentials).
        self.endpoint = f"{parsed.scheme}://{self._hostport}"
        self._client_lock = threading.Lock()
        self._client_state: tuple[int, Minio, urllib3.PoolManager] | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        endpoint: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        options: S3Options | None = None,
        **tuning: Any,
    ) -> S3Store:
        """Open ``s3://bucket/prefix``; settings not given come from :func:`resolve_s3_options`.

        With ``options``, those are used as they are (the environment is not read) and the
        other keyword arguments override their fields.
        """
        bucket, prefix = parse_s3_url(url)
        given = {
            k: v
            for k, v in dict(
                endpoint=endpoint,
                access_key=access_key,
                secret_key=secret_key,
                session_token=session_token,
                region=region,
            ).items()
            if v is not None
        }
        if options is not None:
            options = replace(options, **given, **tuning)
        else:
            options = resolve_s3_options(profile=profile, **given, **tuning)
        return cls(bucket, prefix, options=options)

    # ------------------------------------------------------------------ plumbing

    @property
    def supports_cas(self) -> bool:
        return True

    @property
    def _client(self) -> Minio:
        """The process's client; a forked child builds its own instead of sharing sockets."""
        state = self._client_state
        pid = os.getpid()
        if state is None or state[0] != pid:
            with self._client_lock:
                state = self._client_state
                if state is None or state[0] != pid:
                    state = (pid, *self._make_client())
                    self._client_state = state
        return state[1]

    def _make_client(self) -> tuple[Minio, urllib3.PoolManager]:
        opts = self.options
        pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=opts.max_connections,
            block=False,
            timeout=urllib3.Timeout(connect=opts.connect_timeout, read=opts.read_timeout),
            retries=False,  # we retry ourselves, with jitter and a clear final error
            cert_reqs="CERT_REQUIRED" if opts.verify_tls else "CERT_NONE",
            ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        )
        region = opts.region
        if region is None and "amazonaws.com" not in self._hostport:
            region = "us-east-1"  # S3-compatible servers ignore it; saves a GetBucketLocation
        client = Minio(
            self._hostport,
            access_key=opts.access_key,
            secret_key=opts.secret_key,
            session_token=opts.session_token,
            secure=self._secure,
            region=region,
            http_client=pool,
        )
        return client, pool

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickles carry the settings, never a client or its sockets.
        return (_reopen, (type(self), self.bucket, self.prefix, self.options))

    def close(self) -> None:
        with self._client_lock:
            state, self._client_state = self._client_state, None
        if state is not None and state[0] == os.getpid():
            state[2].clear()

    def _name(self, key: str) -> str:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts):
            raise BadInputError(f"invalid store key {key!r}", subject=key)
        return self._root + key

    def _subject(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._root}{key}" if key else self.url

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """Run one request, retrying transient failures; translate every backend error."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except TierdataError:
                raise
            except _BACKEND_ERRORS as exc:
                self._give_up_unless_transient(exc, op, key, attempt)
            self._pause(attempt)

    def _give_up_unless_transient(self, exc: Exception, op: str, key: str, attempt: int) -> None:
        """Return if ``exc`` is worth another try; otherwise raise its translation."""
        if not _is_transient(exc):
            raise self._translate(exc, op, key) from exc
        if attempt >= self.options.max_attempts:
            raise StoreUnavailableError(
                f"{op} failed after {attempt} attempts at {self.endpoint}: {_describe(exc)}",
                subject=self._subject(key),
                hint="check that the S3 endpoint (AWS_ENDPOINT_URL) is up and reachable",
            ) from exc
        log.warning(
            "%s %s at %s failed (%s); retrying", op, self._subject(key), self.endpoint, _describe(exc)
        )

    def _pause(self, attempt: int) -> None:
        """Sleep before try ``attempt + 1``: exponential backoff, half of it random (jitter)."""
        step = min(self.options.backoff_cap, self.options.backoff_base * 2 ** (attempt - 1))
        time.sleep(step / 2 + random.uniform(0, step / 2))

    def _translate(self, exc: Exception, op: str, key: str) -> Exception:
        subject = self._subject(key)
        code, status = _code_and_status(exc)
        if code == "NoSuchBucket":
            return NotFoundError(
                f"bucket {self.bucket!r} does not exist at {self.endpoint}",
                subject=subject,
                hint=f"create it with `dataset init s3://{self.bucket}/...`",
            )
        if code == "NoSuchKey" or status == 404:
            return NotFoundError("no such key", subject=subject)
        if code in _CONFLICT_CODES or (op == "CAS" and status in (409, 412)):
            return ConflictError(
                "compare-and-swap failed: the value changed since it was read",
                subject=subject,
                hint="read it again and retry",
            )
        if code in _DENIED_CODES or status == 403:
            hint = (
                "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the bucket policy"
                if self.options.has_credentials
                else "no S3 credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
            return TierdataError(
                f"{op} denied by {self.endpoint} ({code or status})", subject=subject, hint=hint
            )
        if isinstance(exc, ValueError):
            return BadInputError(f"{op}: {exc}", subject=subject)
        if isinstance(exc, urllib3.exceptions.SSLError):
            return StoreUnavailableError(
                f"TLS error talking to {self.endpoint}: {exc}",
                subject=subject,
                hint="check the endpoint's certificate (SSL_CERT_FILE) or use http:// for a local server",
            )
        return TierdataError(f"{op} failed at {self.endpoint}: {_describe(exc)}", subject=subject)

    # ------------------------------------------------------------------ reads

    def _read(self, name: str, offset: int = 0, length: int = 0) -> tuple[bytes, str]:
        """GET ``name`` (or a range); return the bytes and the ETag they came with."""
        try:
            resp = self._client.get_object(self.bucket, name, offset=offset, length=length)
        except S3Error as e:
            if e.code == "InvalidRange":  # the range starts at or after the end
                return b"", ""
            raise
        try:
            data = resp.read()
        except BaseException:
            resp.close()
            resp.release_conn()
            raise
        resp.release_conn()  # the body was read whole: the connection goes back to the pool
        return data, _unquote(resp.headers.get("ETag", ""))

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        name = self._name(key)
        if byte_range is None:
            return self._call("GET", key, lambda: self._read(name)[0])
        start, end = byte_range
        if start < 0 or end < 0:
            raise BadInputError(f"invalid byte range {byte_range!r}", subject=self._subject(key))
        if end <= start:
            if not self.exists(key):
                raise NotFoundError("no such key", subject=self._subject(key))
            return b""
        return self._call("GET", key, lambda: self._read(name, start, end - start)[0])

    def exists(self, key: str) -> bool:
        name = self._name(key)

        def stat() -> bool:
            try:
                self._client.stat_object(self.bucket, name)
            except S3Error as e:
                if e.code == "NoSuchKey":
                    return False
                raise
            return True

        return self._call("HEAD", key, stat)

    def info(self, key: str) -> ObjectInfo:
        name = self._name(key)

        def stat() -> ObjectInfo:
            try:
                found = self._client.stat_object(self.bucket, name)
            except S3Error as e:
                if e.code == "NoSuchKey":
                    raise NotFoundError("no such key", subject=self._subject(key)) from e
                raise
            mtime = found.last_modified.timestamp() if found.last_modified else 0.0
            return ObjectInfo(key, found.size or 0, mtime)

        return self._call("HEAD", key, stat)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full = self._root + prefix
        after: str | None = None  # a failed listing resumes after the last key it yielded
        failures = 0
        while True:
            try:
                objects = self._client.list_objects(
                    self.bucket, prefix=full, recursive=True, start_after=after
                )
                for obj in objects:
                    name = obj.object_name or ""
                    if name.endswith("/"):
                        continue  # a folder marker (SeaweedFS, consoles), not a value
                    after, failures = name, 0
                    mtime = obj.last_modified.timestamp() if obj.last_modified else 0.0
                    yield ObjectInfo(name[len(self._root) :], obj.size or 0, mtime)
                return
            except _BACKEND_ERRORS as exc:
                failures += 1
                self._give_up_unless_transient(exc, "LIST", prefix, failures)
            self._pause(failures)

    def get_to_file(self, key: str, path: str | os.PathLike[str]) -> None:
        name = self._name(key)
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.part")

        def fetch() -> None:
            resp = self._client.get_object(self.bucket, name)
            try:
                with open(tmp, "wb") as f:
                    shutil.copyfileobj(resp, f, _COPY_BUFFER)
            except BaseException:
                resp.close()
                resp.release_conn()
                raise
            resp.release_conn()

        try:
            self._call("GET", key, fetch)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def read_versioned(self, key: str) -> Versioned:
        name = self._name(key)
        data, etag = self._call("GET", key, lambda: self._read(name))
        return Versioned(data, etag)

    # ------------------------------------------------------------------ writes

    def put(self, key: str, data: BytesLike) -> None:
        name = self._name(key)
        payload = data if isinstance(data, bytes) else memoryview(data).tobytes()
        self._call("PUT", key, lambda: self._upload(name, io.BytesIO(payload), len(payload)))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        name = self._name(key)

        def upload() -> None:
            with open(path, "rb") as f:
                self._upload(name, f, os.fstat(f.fileno()).st_size)

        self._call("PUT", key, upload)

    def _upload(self, name: str, stream: BinaryIO, size: int) -> None:
        """One PUT up to ``part_size`` bytes, else a parallel multipart upload."""
        part = max(self.options.part_size, -(-size // _MAX_PARTS))
        part = -(-part // (1 << 20)) * (1 << 20)
        self._client.put_object(
            self.bucket,
            name,
            stream,
            size,
            part_size=part,
            num_parallel_uploads=self.options.parallel_uploads,
        )

    def touch(self, key: str) -> None:
        """Copy the object onto itself (server side) so its last-modified time is now."""
        from minio.commonconfig import REPLACE, CopySource

        name = self._name(key)
        source = CopySource(self.bucket, name)
        self._call(
            "COPY",
            key,
            lambda: self._client.copy_object(
                self.bucket, name, source, metadata={"x-amz-meta-touched": "1"}, metadata_directive=REPLACE
            ),
        )

    def delete(self, key: str) -> None:
        name = self._name(key)
        self._call("DELETE", key, lambda: self._client.remove_object(self.bucket, name))

    def compare_and_swap(self, key: str, data: BytesLike, expected: str | None) -> str:
        name = self._name(key)
        payload = data if isinstance(data, bytes) else memoryview(data).tobytes()
        condition = {"If-None-Match": "*"} if expected is None else {"If-Match": f'"{_unquote(expected)}"'}
        tries = 0

        def conditional_put() -> str:
            nonlocal tries
            tries += 1
            # _put_object sends headers as given; put_object would turn them into metadata.
            result = self._client._put_object(self.bucket, name, payload, headers=dict(condition))
            return _unquote(result.etag or "")

        try:
            return self._call("CAS", key, conditional_put)
        except ConflictError:
            if tries > 1:
                # An earlier try may have landed before its reply was lost: then the key
                # already holds our bytes, and the swap did succeed.
                try:
                    current = self.read_versioned(key)
                except NotFoundError:
                    current = None
                if current is not None and current.data == payload:
                    return current.token
            raise

    def ensure_bucket(self) -> bool:
        """Create the bucket if it does not exist; return True when this call created it."""

        def make() -> bool:
            client = self._client
            if client.bucket_exists(self.bucket):
                return False
            try:
                client.make_bucket(self.bucket)
            except S3Error as e:
                if e.code == "BucketAlreadyOwnedByYou":
                    return False
                if e.code == "BucketAlreadyExists" and client.bucket_exists(self.bucket):
                    return False  # created concurrently, and we can use it
                if e.code == "BucketAlreadyExists":
                    raise TierdataError(
                        f"bucket {self.bucket!r} belongs to someone else",
                        subject=f"s3://{self.bucket}",
                        hint="bucket names are global on AWS S3: choose another name",
                    ) from e
                raise
            return True

        return self._call("CREATE BUCKET", "", make)


# --------------------------------------------------------------------------- error helpers


def _code_and_status(exc: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status that a minio exception carries, where it has them."""
    if isinstance(exc, S3Error):
        status = getattr(exc.response, "status", None)
        return exc.code, status
    if isinstance(exc, ServerError):
        return None, exc.status_code
    if isinstance(exc, InvalidResponseError):
        return None, getattr(exc, "_code", None)
    return None, None


def _is_transient(exc: BaseException) -> bool:
    """True for failures that another try may cure: network trouble, 5xx, throttling."""
    code, status = _code_and_status(exc)
    if code in _TRANSIENT_CODES or status in _TRANSIENT_STATUS:
        return True
    if isinstance(exc, urllib3.exceptions.SSLError | urllib3.exceptions.LocationValueError):
        return False
    return isinstance(
        exc,
        urllib3.exceptions.HTTPError | HTTPException | ConnectionError | TimeoutError,
    )


def _describe(exc: BaseException) -> str:
    """A short one-line description of a backend error (no URLs with secrets exist in them)."""
    code, status = _code_and_status(exc)
    if code:
        return f"{code} (HTTP {status})" if status else code
    if status:
        return f"HTTP {status}"
    text = str(exc).splitlines()[0] if str(exc) else ""
    if "Connection(host=" in text:  # urllib3 repeats host and port, which the message names already
        text = text.partition("): ")[2] or text
    return f"{type(exc).__name__}: {text}"[:300]


def _reopen(cls: type[S3Store], bucket: str, prefix: str, options: S3Options) -> S3Store:
    return cls(bucket, prefix, options=options)


def _unquote(etag: str) -> str:
    return etag.strip().strip('"')
