"""A three-member Patroni cluster on this machine, with etcd and HAProxy, owned by a test.

* etcd (Debian ``etcd-server``): one member by default, or three (``etcd_members=3``: a quorum
  of two survives the loss of any one, :meth:`PatroniCluster.kill_etcd`), on free loopback
  ports, data in the temp dir.
* Patroni (Debian ``patroni``), three members ``m0`` ``m1`` ``m2``, each managing a
  PostgreSQL of the machine's newest Debian server binaries (``tests/support/servers.py``
  finds them) on its own free port, data dirs under the temp dir. PostgreSQL refuses to run
  as root, so Patroni (and with it PostgreSQL) runs as the ``postgres`` OS user when the
  tests run as root; the temp dir belongs to that user.
* Each member reaches each etcd member through its own TCP proxy (``tests/support/fix_proxy.py``,
  in this process, with Patroni's ``use_proxies`` so it never bypasses the proxies for etcd's
  advertised addresses): :meth:`PatroniCluster.partition` blackholes one member's proxies, which
  partitions that member's Patroni from etcd while PostgreSQL replication and the clients
  still reach it. No network namespace and no firewall rule is needed.
* With ``client_proxies=True``, the clients reach each member through two more proxies of
  its own, one to its PostgreSQL and one to its REST API (HAProxy's health check):
  :meth:`PatroniCluster.cut_clients` blackholes both, which cuts that member off the
  clients (HAProxy and the multi-host DSN) while Patroni, etcd and replication still reach
  it. Without it, HAProxy and the multi-host DSN connect to the members directly.
* HAProxy (Debian ``haproxy``) in front: one read-write port whose health check is Patroni's
  REST ``GET /primary`` on each member (200 only on the leader), ``on-marked-down
  shutdown-sessions`` so clients of a demoted primary are cut. :attr:`dsn` goes through it;
  :attr:`multi_host_dsn` is libpq's ``host=a,b,c target_session_attrs=read-write``.

Everything runs in the foreground as a child process in its own session, so :meth:`close`
can always kill it; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.support.fix_proxy import Proxy
from tests.support.servers import _make_dir, _run_as, _user_kwargs, free_port, pg_bindir

START_TIMEOUT = 90.0  # the whole cluster, on two shared cores
HEAL_TIMEOUT = 90.0  # back to one leader and two streaming replicas after a fault
#: Patroni's timing (dcs): a leader key lives TTL seconds; every LOOP_WAIT each member runs
#: its loop; a DCS or PostgreSQL call is retried for RETRY_TIMEOUT. Patroni's rule is
#: loop_wait + 2 * retry_timeout <= ttl. Small values make failovers fast, not safer.
TTL = 10
LOOP_WAIT = 1
RETRY_TIMEOUT = 4

PG_SETTINGS: dict[str, Any] = {
    # As tests/support/servers.py: only process crashes are injected, never an OS crash.
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": 100,
    "max_wal_senders": 10,
    "max_replication_slots": 10,
    "wal_keep_size": "128MB",
    "log_min_messages": "warning",
    "client_connection_check_interval": "1s",
}


def missing_tools() -> str | None:
    """Why the HA tests cannot run here, or None."""
    for tool in ("etcd", "patroni", "patronictl", "haproxy"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").is_file():
            return f"{tool} is not installed (Debian: apt-get install patroni etcd-server haproxy)"
    if pg_bindir() is None:
        return "no PostgreSQL server binaries"
    return None


class ClusterError(RuntimeError):
    """The cluster did not start or heal in time; the message has the logs' tails."""


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _spawn(cmd: list[str], log: Path, *, as_postgres: bool = False) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **(_user_kwargs() if as_postgres else {}),
        )


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid ...: comm may hold spaces, so split after its ")".
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


@dataclass
class Etcd:
    """One etcd member."""

    name: str
    client_port: int
    peer_port: int
    data: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def status(self) -> dict[str, Any] | None:
        """etcd's v3 maintenance status (its member id and the leader it follows), or None
        when it does not answer."""
        request = urllib.request.Request(
            f"{self.client_url}/v3/maintenance/status", data=b"{}", method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=1) as resp:
                body: dict[str, Any] = json.loads(resp.read())
                return body
        except (OSError, ValueError):
            return None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError):
            return False


@dataclass
class Member:
    name: str
    pg_port: int
    api_port: int
    base: Path
    config: Path
    #: One proxy per etcd member, in the etcd members' order.
    etcd_proxies: list[Proxy]
    proc: subprocess.Popen[bytes] | None = None
    #: With client_proxies: the clients' way to its PostgreSQL and to its REST API.
    pg_proxy: Proxy | None = None
    api_proxy: Proxy | None = None

    @property
    def client_proxies(self) -> list[Proxy]:
        return [p for p in (self.pg_proxy, self.api_proxy) if p is not None]

    @property
    def client_pg_port(self) -> int:
        """The port clients connect to for this member's PostgreSQL."""
        return self.pg_port if self.pg_proxy is None else self.pg_proxy.port

    @property
    def client_api_port(self) -> int:
        return self.api_port if self.api_proxy is None else self.api_proxy.port

    @property
    def datadir(self) -> Path:
        return self.base / "data"

    @property
    def log(self) -> Path:
        return self.base / "patroni.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    def postmaster_pid(self) -> int:
        return int((self.datadir / "postmaster.pid").read_text().split()[0])

    def api(self, path: str, timeout: float = 2.0) -> tuple[int, Any]:
        url = f"http://127.0.0.1:{self.api_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


class PatroniCluster:
    def __init__(
        self,
        *,
        synchronous: bool = False,
        members: int = 3,
        etcd_members: int = 1,
        client_proxies: bool = False,
    ) -> None:
        bindir = pg_bindir()
        assert bindir is not None
        self.bindir = bindir
        self.synchronous = synchronous
        self.base = _make_dir("tenure-ha-")
        self.scope = f"tenure-{self.base.name[-8:]}"
        self.etcd = [
            Etcd(
                name=f"e{i}",
                client_port=free_port(),
                peer_port=free_port(),
                data=self.base / f"etcd-e{i}",
                log=self.base / f"etcd-e{i}.log",
            )
            for i in range(etcd_members)
        ]
        self.haproxy_port = free_port()
        self.haproxy_proc: subprocess.Popen[bytes] | None = None
        self.members: list[Member] = []
        for i in range(members):
            base = self.base / f"m{i}"
            base.mkdir()
            pg_port, api_port = free_port(), free_port()
            self.members.append(
                Member(
                    name=f"m{i}",
                    pg_port=pg_port,
                    api_port=api_port,
                    base=base,
                    config=base / "patroni.yml",
                    etcd_proxies=[Proxy("127.0.0.1", e.client_port) for e in self.etcd],
                    pg_proxy=Proxy("127.0.0.1", pg_port) if client_proxies else None,
                    api_proxy=Proxy("127.0.0.1", api_port) if client_proxies else None,
                )
            )

    # -- addresses ------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """Through HAProxy's read-write port."""
        return f"postgresql://postgres@127.0.0.1:{self.haproxy_port}/postgres"

    @property
    def multi_host_dsn(self) -> str:
        hosts = ",".join("127.0.0.1" for _ in self.members)
        ports = ",".join(str(m.client_pg_port) for m in self.members)
        return (
            f"host={hosts} port={ports} user=postgres dbname=postgres "
            "target_session_attrs=read-write connect_timeout=2"
        )

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> PatroniCluster:
        try:
            self._start_etcd()
            for m in self.members:
                for proxy in [*m.etcd_proxies, *m.client_proxies]:
                    proxy.start()
                self._write_config(m)
            # The first member bootstraps; the others clone it once it leads.
            self.members[0].proc = _spawn(
                ["patroni", str(self.members[0].config)], self.members[0].log, as_postgres=True
            )
            self._wait(lambda: self.leader() == "m0", START_TIMEOUT, "m0 to bootstrap and lead")
            for m in self.members[1:]:
                m.proc = _spawn(["patroni", str(m.config)], m.log, as_postgres=True)
            self._start_haproxy()
            self.wait_healthy(START_TIMEOUT)
        except BaseException:
            self.close()
            raise
        return self

    def _start_etcd(self) -> None:
        # All members at once: a member of a new three-member cluster waits for a quorum.
        for e in self.etcd:
            self._spawn_etcd(e)
        self._wait(lambda: all(e.healthy() for e in self.etcd), 30, "etcd to answer")

    def _spawn_etcd(self, e: Etcd) -> None:
        """Start etcd member ``e``; once its data dir exists (a restart), etcd ignores the
        --initial-* flags and rejoins with what it stored."""
        cluster = ",".join(f"{o.name}={o.peer_url}" for o in self.etcd)
        e.proc = _spawn(
            [
                "etcd",
                f"--name={e.name}",
                f"--data-dir={e.data}",
                f"--listen-client-urls={e.client_url}",
                f"--advertise-client-urls={e.client_url}",
                f"--listen-peer-urls={e.peer_url}",
                f"--initial-advertise-peer-urls={e.peer_url}",
                f"--initial-cluster={cluster}",
                f"--initial-cluster-token={self.scope}",
                "--initial-cluster-state=new",
                "--log-level=warn",
                "--unsafe-no-fsync",
            ],
            e.log,
        )

    def _write_config(self, m: Member) -> None:
        conf: dict[str, Any] = {
            "scope": self.scope,
            "namespace": "/tenure-tests/",
            "name": m.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{m.api_port}",
                "connect_address": f"127.0.0.1:{m.api_port}",
            },
            "etcd3": {
                "hosts": [f"127.0.0.1:{proxy.port}" for proxy in m.etcd_proxies],
                "use_proxies": True,
            },
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": self.synchronous,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": PG_SETTINGS,
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}, "no-sync"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{m.pg_port}",
                "connect_address": f"127.0.0.1:{m.pg_port}",
                "data_dir": str(m.datadir),
                "bin_dir": str(self.bindir),
                "pgpass": str(m.base / "pgpass"),
                # An old primary whose WAL went past the fork (it crashed with commits the
                # new leader never got) is cloned again when pg_rewind cannot bring it back.
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(m.base)},
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "watchdog": {"mode": "off"},
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }
        # JSON is YAML: Patroni reads it as its YAML config.
        m.config.write_text(json.dumps(conf, indent=1))
        user = _run_as()
        if user is not None:
            for path in (m.base, m.config):
                os.chown(path, user.pw_uid, user.pw_gid)

    def _start_haproxy(self) -> None:
        servers = "\n".join(
            f"    server {m.name} 127.0.0.1:{m.client_pg_port} check port {m.client_api_port}"
            for m in self.members
        )
        cfg = self.base / "haproxy.cfg"
        cfg.write_text(
            f"""global
    maxconn 500
defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s
listen rw
    bind 127.0.0.1:{self.haproxy_port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}
"""
        )
        self.haproxy_log = self.base / "haproxy.log"
        self.haproxy_proc = _spawn(["haproxy", "-db", "-f", str(cfg)], self.haproxy_log)

    def close(self) -> None:
        """Kill everything (SIGKILL to each process group), then delete the temp dir."""
        for m in self.members:
            _kill(m.proc)
            m.proc = None
        # PostgreSQL is Patroni's child but runs in its own session: kill it by its pid file.
        for m in self.members:
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(m.postmaster_pid(), signal.SIGKILL)
        # Each proxy takes up to 2 s to join its threads: all at once.
        stoppers = [
            threading.Thread(target=proxy.stop)
            for m in self.members
            for proxy in [*m.etcd_proxies, *m.client_proxies]
        ]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(10)
        _kill(self.haproxy_proc)
        self.haproxy_proc = None
        for e in self.etcd:
            _kill(e.proc)
            e.proc = None
        # Let the killed postmasters' children notice and exit before the files go.
        time.sleep(0.5)
        shutil.rmtree(self.base, ignore_errors=True)

    # -- state ----------------------------------------------------------------------------

    def topology(self) -> list[dict[str, Any]]:
        """Patroni's ``GET /cluster`` members from the first member that answers."""
        for m in self.members:
            with contextlib.suppress(OSError, ValueError):
                status, body = m.api("/cluster")
                if status == 200 and body:
                    members: list[dict[str, Any]] = body.get("members", [])
                    return members
        return []

    def leader(self) -> str | None:
        for row in self.topology():
            if row.get("role") in ("leader", "master", "primary") and row.get("state") == (
                "running"
            ):
                name: str = row["name"]
                return name
        return None

    def replicas(self) -> list[str]:
        """The members that are not the leader, a synchronous standby first (in synchronous
        mode Patroni promotes only that one: a switchover to another is refused)."""
        rows = [r for r in self.topology() if r.get("role") != "leader"]
        rows.sort(key=lambda r: r.get("role") != "sync_standby")
        return [r["name"] for r in rows]

    def healthy(self) -> bool:
        rows = self.topology()
        leaders = [r for r in rows if r.get("role") == "leader" and r.get("state") == "running"]
        streaming = [
            r
            for r in rows
            if r.get("role") in ("replica", "sync_standby")
            and r.get("state") in ("streaming", "running")
            and r.get("lag", 0) in (0, "0")
        ]
        if len(leaders) != 1 or len(streaming) != len(self.members) - 1:
            return False
        if self.synchronous and not any(r.get("role") == "sync_standby" for r in rows):
            return False
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                row = conn.execute(b"SELECT pg_is_in_recovery()").fetchone()
        except psycopg.Error:
            return False
        return row == (False,)

    def wait_healthy(self, timeout: float = HEAL_TIMEOUT) -> None:
        self._wait(self.healthy, timeout, "one leader and two streaming replicas")

    def timeline(self) -> int:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
            # As tests/faults/test_replica.py: the timeline of the WAL being written now.
            row = conn.execute(
                b"SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
            ).fetchone()
        assert row is not None
        return int(row[0])

    def _wait(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            for m in self.members:
                if m.proc is not None and m.proc.poll() is not None:
                    raise ClusterError(f"patroni {m.name} exited:\n{_tail(m.log)}")
            time.sleep(0.2)
        logs = "\n".join(f"-- {m.name}:\n{_tail(m.base / 'patroni.log')}" for m in self.members)
        raise ClusterError(
            f"timed out after {timeout:.0f}s waiting for {what}; topology {self.topology()}\n{logs}"
        )

    # -- faults ---------------------------------------------------------------------------

    def patronictl(self, *args: str, timeout: float = 60) -> str:
        proc = subprocess.run(
            ["patronictl", "-c", str(self.members[0].config), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        # patronictl exits 0 when Patroni refuses a switchover or failover ("Switchover
        # failed, details: 412, ..."): read its answer.
        if proc.returncode != 0 or "failed, details" in proc.stdout:
            raise ClusterError(f"patronictl {' '.join(args)}: {proc.stderr or proc.stdout}")
        return proc.stdout

    def kill_postmaster(self, name: str) -> None:
        os.kill(self.member(name).postmaster_pid(), signal.SIGKILL)

    def switchover(self, leader: str, candidate: str) -> str:
        return self.patronictl(
            "switchover", "--leader", leader, "--candidate", candidate, "--force", self.scope
        )

    def failover(self, candidate: str) -> str:
        return self.patronictl("failover", "--candidate", candidate, "--force", self.scope)

    def partition(self, name: str) -> None:
        """Cut member ``name``'s Patroni off etcd (its proxies blackhole, open connections
        included); its PostgreSQL still serves replication and clients."""
        for proxy in self.member(name).etcd_proxies:
            proxy.blackhole()
            proxy.cut()

    def stop_wal_senders(self, name: str) -> int:
        """SIGSTOP the WAL senders of member ``name`` (the leader): its standbys stop getting
        WAL from now on (stopping their receivers would not do: the kernel's socket buffers
        would still take the WAL in). Returns how many were stopped."""
        with psycopg.connect(self.member(name).dsn, autocommit=True, connect_timeout=2) as conn:
            pids = [r[0] for r in conn.execute(b"SELECT pid FROM pg_stat_replication")]
        for pid in pids:
            os.kill(int(pid), signal.SIGSTOP)
        return len(pids)

    def crash(self, name: str) -> None:
        """SIGKILL member ``name``'s Patroni, then its postmaster: the whole member is gone
        (nothing restarts it) until :meth:`revive`."""
        m = self.member(name)
        pid = m.postmaster_pid()
        _kill(m.proc)
        m.proc = None
        # The postmaster's children too, at once: a WAL sender outlives a killed postmaster
        # until it notices, and would still ship the WAL the standbys must not get.
        for victim in [pid, *_children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)

    def revive(self, name: str) -> None:
        """Start member ``name``'s Patroni again: it rewinds (pg_rewind) if its data went
        past the new leader's timeline, then follows it."""
        m = self.member(name)
        m.proc = _spawn(["patroni", str(m.config)], m.log, as_postgres=True)

    def heal(self, name: str) -> None:
        for proxy in self.member(name).etcd_proxies:
            proxy.heal()

    def cut_clients(self, name: str) -> None:
        """Cut member ``name`` off the clients (needs ``client_proxies``): its PostgreSQL
        and REST API proxies blackhole, as a silent network does: open connections hang
        (no reset) and new ones get no answer; HAProxy's health check of it times out.
        Patroni, etcd and replication still reach it, so nothing fails over."""
        m = self.member(name)
        assert m.client_proxies, "the cluster was started without client_proxies"
        for proxy in m.client_proxies:
            proxy.blackhole()

    def heal_clients(self, name: str) -> None:
        """End :meth:`cut_clients`: as TCP retransmission would, bytes sent during the cut
        are delivered now, late."""
        for proxy in self.member(name).client_proxies:
            proxy.heal()

    # -- etcd -----------------------------------------------------------------------------

    def etcd_leader(self) -> Etcd | None:
        """The etcd member that leads the etcd cluster now, as the first one that answers
        says."""
        for e in self.etcd:
            status = e.status() if e.proc is not None else None
            if status and status.get("leader"):
                leader = str(status["leader"])
                for o in self.etcd:
                    st = o.status() if o.proc is not None else None
                    if st and str(st.get("header", {}).get("member_id")) == leader:
                        return o
        return None

    def kill_etcd(self, e: Etcd) -> None:
        """SIGKILL etcd member ``e`` (nothing restarts it until :meth:`revive_etcd`)."""
        _kill(e.proc)
        e.proc = None

    def revive_etcd(self, e: Etcd) -> None:
        self._spawn_etcd(e)

    def __enter__(self) -> PatroniCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
