"""``tenure demo``: the seed's acceptance scenario, live, with real processes.

Executor A takes token N and is frozen with SIGSTOP (a GC pause, a network stall); its lease
expires by the database clock; executor B takes token N+1 and writes its result; A is
resumed (SIGCONT) and tries to write: the fence rejects it. The final result must be B's.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Any

JOB_KEY = "demo:nightly-report"


def _emit(**fields: Any) -> None:
    print(json.dumps(fields, default=str), flush=True)


def executor(name: str, key: str, ttl: float, schema: str, hold: bool) -> int:
    """One executor process. Prints one JSON line per event on stdout."""
    import tenure

    with tenure.connect(schema=schema) as client:
        lease = client.acquire(key, ttl=ttl)
        if lease is None:
            _emit(event="busy", name=name)
            return 2
        _emit(
            event="acquired",
            name=name,
            pid=os.getpid(),
            token=lease.token,
            owner=str(lease.owner),
            expires_at=lease.expires_at.isoformat(),
            db_now=client.now().isoformat(),
        )
        if hold:
            # The slow downstream call: A waits here for its answer. While it waits it is
            # frozen by SIGSTOP, and it never renews.
            sys.stdin.readline()
        payload = {"by": name, "token": lease.token}
        try:
            result = client.results.put(key, payload, token=lease.token)
        except tenure.StaleTokenError as exc:
            _emit(
                event="rejected",
                name=name,
                token=lease.token,
                current_token=exc.current_token,
                error=str(exc),
                db_now=client.now().isoformat(),
            )
            return 3
        _emit(
            event="written", name=name, token=result.token, written_at=result.written_at.isoformat()
        )
        return 0


def _read_event(stream: IO[str], who: str) -> dict[str, Any]:
    line = stream.readline()
    if not line:
        raise RuntimeError(f"executor {who} exited without reporting; see its error output above")
    event: dict[str, Any] = json.loads(line)
    return event


def _spawn(
    name: str, key: str, ttl: float, schema: str, dsn: str, hold: bool
) -> subprocess.Popen[str]:
    env = dict(os.environ, TENURE_DSN=dsn)
    args = [sys.executable, "-m", "tenure.cli.demo", name, key, str(ttl), schema]
    if hold:
        args.append("--hold")
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _t(iso: str) -> str:
    """The time-of-day part of a database timestamp, for narration."""
    return iso.split("T", 1)[-1][:12]


def run(dsn: str | None, schema: str, ttl: float, say: Callable[[str], None]) -> bool:
    """Run the scenario; narrate with ``say``; return True when every check held."""
    import tenure

    from ..db.dsn import resolve

    conninfo, source = resolve(dsn)
    started = time.monotonic()
    with tenure.connect(conninfo, schema=schema, migrate=True) as client:
        say(f"database: {client.where} ({source}), schema {schema!r}, lease TTL {ttl:g}s")
        a = _spawn("A", JOB_KEY, ttl, schema, conninfo, hold=True)
        b: subprocess.Popen[str] | None = None
        try:
            assert a.stdout is not None and a.stdin is not None
            ev = _read_event(a.stdout, "A")
            if ev["event"] != "acquired":
                say(f"A could not acquire the lease ({ev}); is another demo running?")
                return False
            token_a = int(ev["token"])
            say(
                f"[db {_t(ev['db_now'])}] A (pid {a.pid}) acquired {JOB_KEY!r}: "
                f"fencing token {token_a}, lease until {_t(ev['expires_at'])}"
            )
            os.kill(a.pid, signal.SIGSTOP)
            say(
                f"[db {_t(client.now().isoformat())}] A is frozen with SIGSTOP mid-job, as in "
                "a long GC pause: it cannot renew"
            )
            while True:
                info = client.inspect(JOB_KEY)
                if info is not None and not info.held:
                    break
                time.sleep(0.05)
            say(
                f"[db {_t(info.observed_at.isoformat())}] A's lease expired by the database "
                f"clock (it ran until {_t(info.expires_at.isoformat())}); A is still frozen"
            )
            b = _spawn("B", JOB_KEY, ttl, schema, conninfo, hold=False)
            assert b.stdout is not None
            ev_b = _read_event(b.stdout, "B")
            if ev_b["event"] != "acquired":
                say(f"B could not acquire the lease: {ev_b}")
                return False
            token_b = int(ev_b["token"])
            say(f"[db {_t(ev_b['db_now'])}] B (pid {b.pid}) took over with token {token_b}")
            ev_b = _read_event(b.stdout, "B")
            say(
                f"[db {_t(ev_b.get('written_at', ''))}] B wrote its result with token "
                f"{ev_b.get('token')} ({ev_b['event']})"
            )
            b.wait(timeout=30)
            os.kill(a.pid, signal.SIGCONT)
            say(
                f"[db {_t(client.now().isoformat())}] A resumes (SIGCONT), unaware, and "
                f"writes its result with token {token_a}"
            )
            a.stdin.write("go\n")
            a.stdin.flush()
            ev_a = _read_event(a.stdout, "A")
            a.wait(timeout=30)
            if ev_a["event"] == "rejected":
                say(
                    f"[db {_t(ev_a['db_now'])}] A's write affected zero rows and was rejected: "
                    f"StaleTokenError (token {token_a} < accepted token "
                    f"{ev_a['current_token']})"
                )
            else:
                say(f"A's write was NOT rejected: {ev_a}")
            final = client.results.get(JOB_KEY)
            say(
                f"stored result: {json.dumps(final.payload) if final else None} "
                f"(written by token {final.token if final else None})"
            )
        finally:
            for proc in (a, b):
                if proc is not None and proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                    proc.wait()
        ok = (
            token_b == token_a + 1
            and ev_a["event"] == "rejected"
            and a.returncode == 3
            and final is not None
            and final.payload == {"by": "B", "token": token_b}
        )
        elapsed = time.monotonic() - started
        if ok:
            say(
                f"verdict: PASS in {elapsed:.1f}s: the successor's result stands; the paused "
                "executor could not commit an older result"
            )
        else:
            say(f"verdict: FAIL in {elapsed:.1f}s: see the steps above")
        return ok


if __name__ == "__main__":
    # python -m tenure.cli.demo NAME KEY TTL SCHEMA [--hold]: one executor, run by `tenure demo`.
    name_, key_, ttl_, schema_ = sys.argv[1:5]
    # The demo narrates the refused write itself: the library's own warning for it (which a
    # program without logging configured sees on stderr) would say it twice.
    logging.getLogger("tenure").setLevel(logging.ERROR)
    sys.exit(executor(name_, key_, float(ttl_), schema_, "--hold" in sys.argv[5:]))
