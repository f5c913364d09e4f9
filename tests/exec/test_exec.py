"""`tenure exec`: real `tenure exec` processes running real commands, with real signals.

Every scenario here starts `python -m tenure exec ...` as a child process and checks what
its command saw and did (files it wrote, its environment), its exit code and the database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import tenure
from tests.support.env import run_tenure, tenure_env
from tests.support.fix_proxy import Proxy
from tests.support.roles import app_role

PY = sys.executable
# Generous: the machine is shared, and a `tenure exec` start costs a Python start-up.
PATIENCE = 30.0


def _exec(args: list[str], env: dict[str, str], **kwargs: object) -> subprocess.Popen[str]:
    """Start `tenure exec ARGS` in the background."""
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [PY, "-m", "tenure", "exec", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = PATIENCE) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _wait_for(
    check: Callable[[], object],
    what: str,
    timeout: float = PATIENCE,
    proc: subprocess.Popen[str] | None = None,
) -> None:
    """Poll ``check``; with ``proc``, fail at once (with its output) if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(
                f"tenure exec exited {proc.returncode} before {what}: stdout={out!r} stderr={err!r}"
            )
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def env(dsn: str, schema: str, client: tenure.Client) -> dict[str, str]:
    """Environment for `tenure exec`: the test database and a migrated schema."""
    return tenure_env(dsn, schema)


@pytest.fixture
def reap() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes to kill if a test fails halfway (SIGCONT first: they may be stopped)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a command left running holds the pipes open
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()


@pytest.fixture
def groups() -> Iterator[list[Path]]:
    """pid files of commands' process groups, killed at the end whatever happened."""
    files: list[Path] = []
    yield files
    for path in files:
        if path.exists() and path.read_text().strip():
            pid = int(path.read_text())
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)


# -- one holder at a time ---------------------------------------------------------------------


def test_two_execs_at_once_one_runs_other_is_busy(
    env: dict[str, str],
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
) -> None:
    log, release = tmp_path / "log", tmp_path / "release"
    groups.extend([tmp_path / "pid0", tmp_path / "pid1"])
    both = [
        _exec(
            [
                "--key",
                "job",
                "--",
                "sh",
                "-c",
                f"echo $$ > {tmp_path}/pid{i}; echo $TENURE_FENCING_TOKEN >> {log}; "
                f"while [ ! -e {release} ]; do sleep 0.05; done",
            ],
            env,
        )
        for i in range(2)
    ]
    reap.extend(both)
    # The loser answers "busy" at once; the winner's command runs until we release it.
    _wait_for(lambda: any(p.poll() is not None for p in both), "the busy one to exit")
    loser = next(p for p in both if p.poll() is not None)
    winner = next(p for p in both if p is not loser)
    code, out, err = _finish(loser)
    assert code == 0
    line = _one_line(err)
    assert "busy" in line and "token 1" in line and "database clock" in line
    assert out == ""
    # --busy-exit changes the code; --quiet the noise.
    code, _, err = _finish(_exec(["--key", "job", "--busy-exit", "3", "--", "true"], env))
    assert code == 3 and "busy" in err
    code, _, err = _finish(_exec(["--key", "job", "-q", "--", "true"], env))
    assert code == 0 and err == ""
    release.touch()
    code, _, err = _finish(winner)
    assert code == 0, err
    assert log.read_text().split() == ["1"]


def test_command_environment_and_exit_code(
    env: dict[str, str], client: tenure.Client, schema: str, dsn: str
) -> None:
    dump = f"{PY} -c 'import json, os; print(json.dumps(dict(os.environ)))'; exit 7"
    result = run_tenure(["exec", "--key", "job", "--", "sh", "-c", dump], env)
    assert result.returncode == 7, result.stderr
    seen = json.loads(result.stdout)
    info = client.inspect("job")
    assert info is not None
    assert seen["TENURE_JOB_KEY"] == "job"
    assert seen["TENURE_FENCING_TOKEN"] == str(info.token) == "1"
    assert seen["TENURE_LEASE_OWNER"] == str(info.owner)
    assert seen["TENURE_DSN"] == dsn
    assert seen["TENURE_SCHEMA"] == schema
    assert "TENURE_SLOT" not in seen
    # Released when the command ended: a successor can start at once, with the next token.
    assert not info.held
    lease = client.acquire("job", ttl=5)
    assert lease is not None and lease.token == 2


def test_nested_exec_uses_its_own_key_not_the_outer_one(
    env: dict[str, str], client: tenure.Client
) -> None:
    """The outer exec exports TENURE_JOB_KEY to its command; a nested `tenure exec --key
    inner` must run under 'inner', not read the outer key as its own --key (and find it
    busy). The nested command still sees its own key and token."""
    inner = f"{PY} -m tenure exec --key inner -- sh -c 'echo $TENURE_JOB_KEY $TENURE_FENCING_TOKEN'"
    result = run_tenure(["exec", "--key", "outer", "--", "sh", "-c", inner], env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["inner", "1"]
    assert "busy" not in result.stderr
    outer, nested = client.inspect("outer"), client.inspect("inner")
    assert outer is not None and nested is not None and nested.token == 1


def test_nested_exec_without_key_does_not_take_the_outer_key(
    env: dict[str, str], client: tenure.Client
) -> None:
    """TENURE_JOB_KEY is what the outer exec tells its command, not an option of a nested
    exec: one that was given no --key is a usage error (exit 2), not a silent 'outer is
    busy' (exit 0) that never runs its command."""
    inner = f"{PY} -m tenure exec -- echo hi"
    result = run_tenure(["exec", "--key", "outer", "--", "sh", "-c", inner], env)
    assert "busy" not in result.stderr
    assert result.returncode == 2, result.stderr
    assert "Missing option '--key'" in _one_line(result.stderr)
    assert client.inspect("outer") is not None


def test_exec_options_set_in_the_environment_do_not_reach_a_nested_exec(
    env: dict[str, str], client: tenure.Client
) -> None:
    """Options given to the outer exec through their TENURE_EXEC_* twins are the outer
    exec's: a nested exec does not inherit them (here --slot, which would make the nested
    run find its slot... or share one it was never given)."""
    dump = f"{PY} -c 'import json, os; print(json.dumps(dict(os.environ)))'"
    nested = f'{PY} -m tenure exec --key inner -- sh -c "{dump}"'
    outer_env = {**env, "TENURE_EXEC_KEY": "outer", "TENURE_EXEC_SLOT": "s1"}
    result = run_tenure(["exec", "--", "sh", "-c", nested], outer_env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["TENURE_JOB_KEY"] == "inner"
    assert "TENURE_SLOT" not in seen  # the nested run had no --slot
    assert not [name for name in seen if name.startswith("TENURE_EXEC_")]
    assert client.inspect("outer") is not None


def test_leftover_processes_in_the_group_are_killed(env: dict[str, str], tmp_path: Path) -> None:
    """The lease ends with the command: what it left running in its group does not outlive
    it (this fails if only the command itself is waited for)."""
    bg = tmp_path / "bg"
    script = f"sleep 60 >/dev/null 2>&1 & echo $! > {bg}; exit 0"
    result = run_tenure(["exec", "--key", "job", "--", "sh", "-c", script], env)
    assert result.returncode == 0, result.stderr
    pid = int(bg.read_text())
    _wait_for(lambda: not _alive(pid), "the leftover sleep to be killed", timeout=5)


def _freeze_past_ttl(proc: subprocess.Popen[str], group: int, client: tenure.Client) -> None:
    """SIGSTOP `tenure exec` and its command's group until the lease of 'job' has expired
    by the database clock."""
    os.kill(proc.pid, signal.SIGSTOP)
    os.killpg(group, signal.SIGSTOP)

    def expired() -> bool:
        info = client.inspect("job")
        return info is not None and not info.held

    _wait_for(expired, "the frozen holder's lease to expire by the database clock")


# -- paused past the TTL ------------------------------------------------------------------------


def test_paused_holder_and_command_cannot_store_their_result(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
) -> None:
    """SIGSTOP `tenure exec` and its command past the TTL; a second `tenure exec` runs with
    token+1 and stores its result; SIGCONT the first: its command's `tenure result put`
    is rejected (the command ignores SIGTERM, so it does try) and nothing of it is stored."""
    d = tmp_path
    pidfile = d / "a_pid"
    groups.append(pidfile)
    script_a = (
        "trap '' TERM; "
        f"echo $$ > {pidfile}; echo $TENURE_FENCING_TOKEN > {d}/a_token; "
        f"while [ ! -e {d}/go ]; do sleep 0.05; done; "
        f"""echo '{{"by": "A"}}' | {PY} -m tenure result put > {d}/a_put 2>&1; """
        f"echo $? > {d}/a_put_rc"
    )
    first = _exec(
        ["--key", "job", "--ttl", "1s", "--grace", "20s", "--", "sh", "-c", script_a], env
    )
    reap.append(first)
    _wait_for(
        lambda: (d / "a_token").exists() and pidfile.read_text().strip(), "A to start", proc=first
    )
    token_a = int((d / "a_token").read_text())
    group_a = int(pidfile.read_text())
    _freeze_past_ttl(first, group_a, client)
    script_b = (
        f"echo $TENURE_FENCING_TOKEN > {d}/b_token; "
        f"""echo '{{"by": "B"}}' | {PY} -m tenure result put"""
    )
    second = run_tenure(["exec", "--key", "job", "--ttl", "30s", "--", "sh", "-c", script_b], env)
    assert second.returncode == 0, second.stderr
    assert int((d / "b_token").read_text()) == token_a + 1

    (d / "go").touch()
    os.killpg(group_a, signal.SIGCONT)
    os.kill(first.pid, signal.SIGCONT)
    code, _, err = _finish(first)
    assert code == 75, err
    assert "lost" in err
    assert (d / "a_put_rc").read_text().strip() == "1"
    assert "stale" in (d / "a_put").read_text()
    stored = client.results.get("job")
    assert stored is not None
    assert stored.token == token_a + 1 and stored.payload == {"by": "B"}


def test_result_put_inside_exec_is_strict_once_a_successor_took_over(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
) -> None:
    """Inside `tenure exec`, `tenure result put` (token from $TENURE_FENCING_TOKEN) applies
    fence()'s rule: once a successor has taken over, the write is refused even though the
    successor has not written anything. `--no-strict` is the seed's rule, which accepts it
    (the documented difference)."""
    d = tmp_path
    script = (
        f"touch {d}/started; while [ ! -e {d}/go ]; do sleep 0.05; done; "
        f"""echo '{{"by": "old"}}' | {PY} -m tenure result put > {d}/strict 2>&1; """
        f"echo $? > {d}/strict_rc; "
        f"""echo '{{"by": "old"}}' | {PY} -m tenure result put --no-strict > {d}/seed 2>&1; """
        f"echo $? > {d}/seed_rc"
    )
    # A long TTL: the exec's next renewal (which would notice the takeover) is minutes away.
    proc = _exec(["--key", "job", "--ttl", "300s", "--", "sh", "-c", script], env)
    reap.append(proc)
    _wait_for((d / "started").exists, "the command")
    assert client.release("job") == 1  # an operator expires the lease...
    successor = client.acquire("job", ttl=60)  # ...and a successor takes over, writing nothing
    assert successor is not None and successor.token == 2
    (d / "go").touch()
    _wait_for((d / "seed_rc").exists, "the command's writes")
    assert (d / "strict_rc").read_text().strip() == "1", (d / "strict").read_text()
    assert "stale fencing token" in (d / "strict").read_text()
    assert "token 1 rejected" in (d / "strict").read_text()
    assert (d / "seed_rc").read_text().strip() == "0", (d / "seed").read_text()
    stored = client.results.get("job")
    assert stored is not None and stored.token == 1  # accepted only under the seed's rule
    code, _, err = _finish(proc)
    assert code == 0, err  # the command's own code: exec noticed nothing (no renewal yet)


#: How a script may pass the enclosing exec's key and token to `tenure result put`.
SPELLINGS = {
    "flagless": "",
    "key-and-token": '--key "$TENURE_JOB_KEY" --token "$TENURE_FENCING_TOKEN"',
    "token-only": '--token "$TENURE_FENCING_TOKEN"',
    "equals-form": '--token="$TENURE_FENCING_TOKEN" --key="$TENURE_JOB_KEY"',
}


def test_paused_holder_write_inside_exec_is_strict_however_the_token_is_passed(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
) -> None:
    """Issue 31: `tenure exec` and its command are frozen (SIGSTOP) past the TTL and a
    successor takes over without writing anything. Resumed, the command's `tenure result
    put` is refused whether it relies on $TENURE_JOB_KEY/$TENURE_FENCING_TOKEN or passes the
    same values as options; only an explicit `--no-strict` asks for the seed's rule (which
    accepts it: no newer token has written). Failed before the fix for the spelled-out
    forms: `stored with token 1`, exit 0."""
    d = tmp_path
    pidfile = d / "pid"
    groups.append(pidfile)
    put = f"""echo '{{"by": "old"}}' | {PY} -m tenure result put"""
    writes = "".join(
        f"{put} {spelling} > {d}/{name} 2>&1; echo $? > {d}/{name}_rc; "
        for name, spelling in SPELLINGS.items()
    )
    script = (
        "trap '' TERM; "  # it does try to write, after exec's SIGTERM too
        f"echo $$ > {pidfile}; "
        f"while [ ! -e {d}/go ]; do sleep 0.05; done; "
        f"{writes}"
        f"{put} {SPELLINGS['key-and-token']} --no-strict > {d}/seed 2>&1; echo $? > {d}/seed_rc"
    )
    proc = _exec(["--key", "job", "--ttl", "1s", "--grace", "60s", "--", "sh", "-c", script], env)
    reap.append(proc)
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command", proc=proc)
    group = int(pidfile.read_text())
    _freeze_past_ttl(proc, group, client)
    successor = client.acquire("job", ttl=300)  # takes over, writes nothing
    assert successor is not None and successor.token == 2
    (d / "go").touch()
    os.killpg(group, signal.SIGCONT)
    os.kill(proc.pid, signal.SIGCONT)
    _wait_for((d / "seed_rc").exists, "the command's writes", timeout=PATIENCE * 2)
    for name in SPELLINGS:
        said = (d / name).read_text()
        assert (d / f"{name}_rc").read_text().strip() == "1", (name, said)
        assert "stale fencing token" in said and "token 1 rejected" in said, (name, said)
    assert (d / "seed_rc").read_text().strip() == "0", (d / "seed").read_text()
    stored = client.results.get("job")
    assert stored is not None and stored.token == 1  # accepted only under the seed's rule
    code, _, err = _finish(proc, timeout=PATIENCE * 3)
    assert code == 75, err


def test_write_refused_after_the_lease_was_released_says_so(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
) -> None:
    """Issue 31: an operator releases the lease while the command runs, and no successor
    takes over: the command's strict write is refused, and the warning and the error say the
    lease was released (before: "rejected: token 1, current token 1")."""
    d = tmp_path
    script = (
        f"touch {d}/started; while [ ! -e {d}/go ]; do sleep 0.05; done; "
        f"""echo '{{"by": "old"}}' | {PY} -m tenure result put > {d}/put 2>&1; """
        f"echo $? > {d}/put_rc"
    )
    proc = _exec(["--key", "job", "--ttl", "300s", "--", "sh", "-c", script], env)
    reap.append(proc)
    _wait_for((d / "started").exists, "the command", proc=proc)
    assert client.release("job") == 1
    (d / "go").touch()
    _wait_for((d / "put_rc").exists, "the command's write", proc=proc)
    said = (d / "put").read_text()
    assert (d / "put_rc").read_text().strip() == "1", said
    assert "current token 1" not in said, said
    lines = said.strip().splitlines()
    assert len(lines) == 2, said  # the warning, then the error
    assert all("lease of token 1 was released" in line for line in lines), said
    assert client.results.get("job") is None
    code, _, err = _finish(proc)
    assert code == 0, err


# -- lease lost while the command runs ----------------------------------------------------------


@pytest.mark.parametrize("obeys_sigterm", [True, False], ids=["obeys-sigterm", "ignores-sigterm"])
def test_lease_taken_over_stops_the_command_within_grace(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
    obeys_sigterm: bool,
) -> None:
    """An operator expires the lease and another execution takes it: the next renewal is
    refused, the command's group gets SIGTERM (then SIGKILL after --grace if it ignores
    SIGTERM) and `tenure exec` exits 75. The slot of a lost run can run again."""
    pidfile = tmp_path / "pid"
    groups.append(pidfile)
    trap = "" if obeys_sigterm else "trap '' TERM; "
    script = f"{trap}echo $$ > {pidfile}; while :; do sleep 0.05; done"
    grace = 10.0 if obeys_sigterm else 2.0
    args = ["--key", "job", "--ttl", "1.5s", "--grace", f"{grace}s", "--slot", "s1"]
    proc = _exec([*args, "--", "sh", "-c", script], env)
    reap.append(proc)
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command to start")
    pid = int(pidfile.read_text())
    assert client.release("job") == 1
    successor = client.acquire("job", ttl=30)
    assert successor is not None and successor.token == 2
    taken = time.monotonic()
    code, _, err = _finish(proc)
    elapsed = time.monotonic() - taken
    assert code == 75, err
    assert "lost" in err and "Traceback" not in err
    assert not _alive(pid)
    if obeys_sigterm:
        # SIGTERM stopped it, long before SIGKILL was due.
        assert "exit status: 143" in err
        assert elapsed < grace, elapsed
    else:
        # SIGKILL came only after the grace period (SIGTERM was ignored).
        assert "exit status: 137" in err
        assert elapsed >= grace * 0.9, elapsed
    # The lost run did not complete slot s1: it runs again, with a higher token.
    successor.release()
    again = run_tenure(
        ["exec", "--key", "job", "--slot", "s1", "--", "sh", "-c", "echo $TENURE_FENCING_TOKEN"],
        env,
    )
    assert again.returncode == 0, again.stderr
    assert int(again.stdout) == 3


def test_database_unreachable_stops_the_command_at_the_local_deadline(
    dsn: str,
    schema: str,
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
) -> None:
    """A network partition between `tenure exec` and PostgreSQL: renewals cannot get through,
    so the command is stopped at the local deadline (before the lease can expire by the
    database clock) and the exit code says the lease was lost."""
    pidfile = tmp_path / "pid"
    groups.append(pidfile)
    with Proxy.from_dsn(dsn) as proxy:
        env = tenure_env(proxy.dsn(dsn), schema)
        script = f"echo $$ > {pidfile}; exec sleep 60"
        proc = _exec(
            ["--key", "job", "--ttl", "2s", "--grace", "1s", "--", "sh", "-c", script], env
        )
        reap.append(proc)
        _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command")
        pid = int(pidfile.read_text())
        proxy.blackhole()
        cut = time.monotonic()
        code, _, err = _finish(proc)
        elapsed = time.monotonic() - cut
        proxy.heal()
    assert code == 75, err
    assert "lost" in err and "Traceback" not in err
    assert "exit status: 143" in err  # SIGTERM, at the local deadline
    assert not _alive(pid)
    # Stopped no later than the TTL allows (+ scheduling slack), not at some timeout.
    assert elapsed < 2.0 + PATIENCE / 3, elapsed
    info = client.inspect("job")
    assert info is not None and info.token == 1


# -- signals ----------------------------------------------------------------------------------


def test_sigterm_is_forwarded_and_the_lease_released(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
) -> None:
    pidfile = tmp_path / "pid"
    groups.append(pidfile)
    script = (
        f"trap 'echo got-term > {tmp_path}/term; exit 42' TERM; "
        f"echo $$ > {pidfile}; while :; do sleep 0.05; done"
    )
    proc = _exec(["--key", "job", "--", "sh", "-c", script], env)
    reap.append(proc)
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command")
    proc.send_signal(signal.SIGTERM)
    code, _, err = _finish(proc)
    assert code == 42, err
    assert (tmp_path / "term").read_text().strip() == "got-term"
    info = client.inspect("job")
    assert info is not None and not info.held


#: tgkill(2)'s system call number: a signal to one thread of a process.
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


def _tgkill(pid: int, tid: int, signum: int) -> None:
    import ctypes
    import platform

    number = SYS_TGKILL.get(platform.machine())
    if number is None:
        pytest.skip(f"tgkill's number on {platform.machine()} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def test_sigterm_delivered_to_another_thread_of_exec_is_still_passed_on(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
) -> None:
    """A signal sent to `tenure exec` may be delivered to any of its threads (the lease's
    renewal thread, the pool's): under load the kernel picks one. Here it is sent to a thread
    other than the main one, as the kernel may: it is passed on all the same. Before the fix
    the main thread, blocked waiting for the command, never ran the handler, and the command
    never saw the SIGTERM (the flaky forwarded-SIGTERM test under load)."""
    pidfile = tmp_path / "pid"
    groups.append(pidfile)
    script = f"trap 'exit 42' TERM; echo $$ > {pidfile}; while :; do sleep 0.05; done"
    proc = _exec(["--key", "job", "--", "sh", "-c", script], env)
    reap.append(proc)
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command", proc=proc)
    others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
    assert others, "tenure exec runs its renewal in a thread"
    _tgkill(proc.pid, others[0], signal.SIGTERM)
    code, _, err = _finish(proc, timeout=PATIENCE * 2)
    assert code == 42, err
    info = client.inspect("job")
    assert info is not None and not info.held


def _stubborn_after_sigterm(
    env: dict[str, str],
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
    grace: str,
) -> tuple[subprocess.Popen[str], int]:
    """`tenure exec --grace GRACE` running a command that notes every SIGTERM and SIGINT and
    keeps running, once it has seen the SIGTERM sent to `tenure exec`: (exec, command pid)."""
    pidfile, seen = tmp_path / "pid", tmp_path / "seen"
    groups.append(pidfile)
    script = (
        f"trap 'echo term >> {seen}' TERM; trap 'echo int >> {seen}' INT; "
        f"echo $$ > {pidfile}; while :; do sleep 0.05; done"
    )
    proc = _exec(["--key", "job", "--grace", grace, "--", "sh", "-c", script], env)
    reap.append(proc)
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command", proc=proc)
    proc.send_signal(signal.SIGTERM)
    _wait_for(seen.exists, "the command to see SIGTERM", proc=proc)
    assert seen.read_text().split()[0] == "term"
    return proc, int(pidfile.read_text())


def _ends_in_sigkill(proc: subprocess.Popen[str], pid: int, client: tenure.Client) -> str:
    """exec exits 137 (generous wait: it only bounds a hang), the command is gone and the
    lease released; returns exec's stderr."""
    code, _, err = _finish(proc, timeout=PATIENCE * 3)
    assert code == 128 + signal.SIGKILL, err
    assert "SIGKILL" in err and "Traceback" not in err, err
    assert not _alive(pid)
    info = client.inspect("job")
    assert info is not None and not info.held
    return err


def test_forwarded_sigterm_not_obeyed_ends_in_sigkill_after_grace(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
) -> None:
    """Issue 31: a command that ignores the SIGTERM `tenure exec` passed on gets SIGKILL
    (its whole group) after --grace, and the lease is released. Before the fix it ran on,
    its lease renewed, until this test's timeout."""
    proc, pid = _stubborn_after_sigterm(env, tmp_path, reap, groups, grace="1s")
    assert "--grace 1s" in _ends_in_sigkill(proc, pid, client)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_second_signal_sigkills_a_command_that_ignored_the_first(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
    second: signal.Signals,
) -> None:
    """Issue 31: once a SIGTERM was passed on, a second SIGTERM or SIGINT to `tenure exec`
    SIGKILLs the command's group at once: with a --grace of an hour, only that can end it
    before this test's timeout."""
    proc, pid = _stubborn_after_sigterm(env, tmp_path, reap, groups, grace="1h")
    proc.send_signal(second)
    assert second.name in _ends_in_sigkill(proc, pid, client)


def test_sigterm_while_waiting_for_the_lease_ends_tenure_cleanly(
    env: dict[str, str],
    client: tenure.Client,
    dsn: str,
    schema: str,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
) -> None:
    """SIGTERM before the command started (here: during --wait): one line, exit 128+15,
    and the command never runs."""
    held = client.acquire("job", ttl=60)
    assert held is not None
    marker = tmp_path / "ran"
    since = client.now()
    proc = _exec(["--key", "job", "--wait", "60s", "--", "touch", str(marker)], env)
    reap.append(proc)
    _wait_for(lambda: _trying_to_acquire(dsn, schema, since), "tenure exec to wait")
    proc.send_signal(signal.SIGTERM)
    code, _, err = _finish(proc)
    assert code == 128 + signal.SIGTERM
    assert "SIGTERM before the command started" in _one_line(err)
    held.release()
    time.sleep(0.5)  # had it survived, it would take the lease and run now
    assert not marker.exists()
    info = client.inspect("job")
    assert info is not None and info.token == 1


def test_command_killed_by_a_signal_exits_128_plus_n(
    env: dict[str, str], tmp_path: Path, reap: list[subprocess.Popen[str]], groups: list[Path]
) -> None:
    pidfile = tmp_path / "pid"
    groups.append(pidfile)
    proc = _exec(["--key", "job", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], env)
    reap.append(proc)
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command")
    proc.send_signal(signal.SIGINT)  # forwarded; sleep dies of it
    code, _, err = _finish(proc)
    assert code == 128 + signal.SIGINT, err


# -- once per slot ------------------------------------------------------------------------------


def _trying_to_acquire(dsn: str, schema: str, since: dt.datetime) -> bool:
    """True once a tenure connection opened after ``since`` (database clock) has an acquire
    in ``schema`` as its latest statement: a `tenure exec --wait` retrying a busy lease (a
    holder's latest statement is a renew or a slot check)."""
    pattern = f'%INSERT INTO "{schema}".job_leases%'
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tenure'"
            " AND backend_start > %s AND query LIKE %s",
            (since, pattern),
        ).fetchone()
    return bool(row and row[0])


def test_slot_fired_on_three_hosts_at_different_moments_runs_once(
    env: dict[str, str],
    client: tenure.Client,
    dsn: str,
    schema: str,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
) -> None:
    """Host 1 runs the slot; host 2 fires while it runs, waits for the lease, takes it when
    host 1 is done and then finds the slot done (the check under the lease); host 3 fires
    after that and finds it done before taking the lease."""
    log, finish = tmp_path / "log", tmp_path / "finish"
    script = (
        f'echo "$TENURE_SLOT $TENURE_FENCING_TOKEN" >> {log}; '
        f"while [ ! -e {finish} ]; do sleep 0.05; done"
    )
    args = ["--key", "report", "--slot", "2024-06-01T00:00Z", "--wait", "30s"]
    host1 = _exec([*args, "--", "sh", "-c", script], env)
    reap.append(host1)
    _wait_for(log.exists, "host 1's command")
    since = client.now()
    host2 = _exec([*args, "--", "sh", "-c", script], env)
    reap.append(host2)
    _wait_for(lambda: _trying_to_acquire(dsn, schema, since), "host 2 to wait for the lease")
    finish.touch()
    assert _finish(host1)[0] == 0
    code, out, err = _finish(host2)
    assert code == 0 and out == ""
    assert "already done" in _one_line(err)
    code, out, err = _finish(_exec([*args, "--", "sh", "-c", script], env))
    assert code == 0 and "already done" in _one_line(err)
    assert log.read_text().splitlines() == ["2024-06-01T00:00Z 1"]
    # Host 2 did take the lease (token 2) before finding the slot done; host 3 did not.
    info = client.inspect("report")
    assert info is not None and info.token == 2 and not info.held


def test_crashed_slot_runs_again_with_a_higher_token(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
    groups: list[Path],
) -> None:
    log, pidfile = tmp_path / "log", tmp_path / "pid"
    groups.append(pidfile)
    base = ["--key", "job", "--slot", "nightly", "--ttl", "1s", "--wait", "20s", "--"]
    record = f"echo $TENURE_FENCING_TOKEN >> {log}"
    # 1: the command fails.
    assert run_tenure(["exec", *base, "sh", "-c", f"{record}; exit 3"], env).returncode == 3
    # 2: `tenure exec` itself is killed mid-run (the lease is left to expire).
    proc = _exec([*base, "sh", "-c", f"{record}; echo $$ > {pidfile}; exec sleep 60"], env)
    reap.append(proc)
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "run 2")
    proc.kill()
    # Killed with SIGKILL, `tenure exec` cannot stop its command (a documented limit): kill
    # it too, as a host crash would (it holds the pipes open).
    os.killpg(int(pidfile.read_text()), signal.SIGKILL)
    proc.communicate()
    # 3: runs (waiting for run 2's lease to expire), with a higher token, and succeeds.
    ok = run_tenure(["exec", *base, "sh", "-c", record], env)
    assert ok.returncode == 0, ok.stderr
    # 4: the slot is done.
    done = run_tenure(["exec", *base, "sh", "-c", record], env)
    assert done.returncode == 0 and "already done" in done.stderr
    assert log.read_text().split() == ["1", "2", "3"]
    assert client.inspect("job").token == 3  # type: ignore[union-attr]


def test_success_after_losing_the_lease_does_not_mark_the_slot_done(
    env: dict[str, str],
    client: tenure.Client,
    tmp_path: Path,
    reap: list[subprocess.Popen[str]],
) -> None:
    """The lease is taken over and the command exits 0 before `tenure exec` notices (its
    next renewal is seconds away): the slot's completion is written in a transaction fenced
    by the old token, which fails, so the slot is not done and runs again. Not a silent
    success: exit 75 (the lease was lost), with one line saying so."""
    started, go = tmp_path / "started", tmp_path / "go"
    script = f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done"
    args = ["--key", "job", "--slot", "s1", "--ttl", "60s"]
    proc = _exec([*args, "--", "sh", "-c", script], env)
    reap.append(proc)
    _wait_for(started.exists, "the command")
    assert client.release("job") == 1
    successor = client.acquire("job", ttl=30)
    assert successor is not None
    go.touch()
    code, _, err = _finish(proc)
    assert code == 75, err
    line = _one_line(err)
    assert "lost" in line and "marked done" in line and "may run again" in line
    successor.release()
    again = run_tenure(["exec", *args, "--", "sh", "-c", "echo $TENURE_FENCING_TOKEN"], env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "3"


def test_slot_that_cannot_be_recorded_is_an_error_not_a_second_run(
    env: dict[str, str], client: tenure.Client, dsn: str, schema: str, tmp_path: Path
) -> None:
    """The role may not write exec_slots (INSERT and UPDATE revoked): a slot it runs could
    never be marked done, so every host would run it again. That is an error (exit 1, one
    line naming the missing privilege), and the command does not run at all."""
    log = tmp_path / "log"
    revoke = ("REVOKE INSERT, UPDATE ON {schema}.exec_slots FROM {role}",)
    with app_role(dsn, schema, revoke=revoke, minimal=False) as role:
        run = ["exec", "--key", "job", "--every", "1m", "--", "sh", "-c", f"echo ran >> {log}"]
        first = run_tenure(run, tenure_env(role, schema))
        second = run_tenure(run, tenure_env(role, schema))
    assert (first.returncode, second.returncode) == (1, 1), first.stderr + second.stderr
    line = _one_line(first.stderr)
    assert "exec_slots" in line and "INSERT" in line and "tenure grants" in line
    assert not log.exists(), "the command ran although its slot could not be recorded"


def test_slot_write_refused_after_the_command_succeeded_is_an_error(
    env: dict[str, str], client: tenure.Client, dsn: str, schema: str, tmp_path: Path
) -> None:
    """The privilege disappears while the command runs (an operator's REVOKE): the command
    succeeded but its slot cannot be marked done: exit 1, one line saying the slot may run
    again, and the run's outcome in the metrics is slot_unrecorded, not succeeded."""
    prom = tmp_path / "job.prom"
    with app_role(dsn, schema, minimal=False) as role:
        rolename = psycopg.conninfo.conninfo_to_dict(role)["user"]
        revoke = (
            f"import psycopg; psycopg.connect({dsn!r}, autocommit=True).execute("
            f'\'REVOKE INSERT ON "{schema}".exec_slots FROM "{rolename}"\')'
        )
        run = [
            "exec", "--key", "job", "--slot", "s1", "--metrics-textfile", str(prom),
            "--", PY, "-c", revoke,
        ]  # fmt: skip
        result = run_tenure(run, tenure_env(role, schema))
    assert result.returncode == 1, result.stderr
    line = _one_line(result.stderr)
    assert "'s1'" in line and "not marked done" in line and "may run again" in line
    assert 'tenure_exec_last_run_outcome{job_key="job",outcome="slot_unrecorded"} 1' in (
        prom.read_text()
    )


def test_every_slot_is_never_run_more_than_the_early_tolerance_before_its_time(
    env: dict[str, str], client: tenure.Client
) -> None:
    # A period whose current slot began more than half a period ago (by at least a minute),
    # and whose next one is minutes away: rounding to the nearest multiple would run the
    # next slot now, minutes early; the slot run is the one that began.
    epoch = client.now().timestamp()
    period = next(p for p in range(600, 86_400, 60) if p / 2 + 60 < epoch % p < p - 120)
    expected = dt.datetime.fromtimestamp(epoch // period * period, dt.UTC)
    run = ["exec", "--key", "job", "--every", f"{period}s", "--", "sh", "-c", "echo $TENURE_SLOT"]
    first = run_tenure(run, env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == expected.strftime("%Y-%m-%dT%H:%M:%SZ")
    second = run_tenure(run, env)
    assert second.returncode == 0 and second.stdout == ""
    assert "already done" in second.stderr
    # --slot and --every together: VALUE@TIMESTAMP, a different slot.
    both = run_tenure(["exec", "--slot", "eu", *run[1:]], env)
    assert both.stdout.strip() == f"eu@{first.stdout.strip()}"


# -- bad input: one line, no traceback, the right code -------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--key", "job", "echo", "hi"], "missing `--`"),
        (["--key", "job", "--bogus", "--", "true"], "No such option"),
        (["--key", "job", "--ttl", "5 parsecs", "--", "true"], "not a duration"),
        (["--key", "job", "--grace", "-1s", "--", "true"], "not a duration"),
        (["--key", "job", "--every", "1.5s", "--", "true"], "whole number of seconds"),
        (["--key", "job", "--"], "no command after"),
        (["--", "true"], "Missing option '--key'"),
    ],
    ids=[
        "missing-dashes",
        "unknown-option",
        "bad-ttl",
        "bad-grace",
        "bad-every",
        "no-command",
        "no-key",
    ],
)
def test_bad_usage_is_one_line_and_exit_2(
    env: dict[str, str], client: tenure.Client, args: list[str], says: str
) -> None:
    result = run_tenure(["exec", *args], env)
    assert result.returncode == 2
    assert says in _one_line(result.stderr)
    assert client.inspect("job") is None  # nothing was acquired


@pytest.mark.parametrize(
    ("command", "code"),
    [(["no-such-command-xyz"], 127), (["/"], 126)],
    ids=["not-found", "not-executable"],
)
def test_command_that_cannot_start_releases_the_lease(
    env: dict[str, str], client: tenure.Client, command: list[str], code: int
) -> None:
    result = run_tenure(["exec", "--key", "job", "--", *command], env)
    assert result.returncode == code
    line = _one_line(result.stderr)
    assert repr(command[0]) in line and "lease released" in line
    info = client.inspect("job")
    assert info is not None and info.token == 1 and not info.held


def test_unreachable_database_is_one_line_and_exit_1(dsn: str, schema: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = tenure_env(f"postgresql://postgres@127.0.0.1:{port}/postgres", schema)
    result = run_tenure(["exec", "--key", "job", "--", "true"], env)
    assert result.returncode == 1
    assert "connection" in _one_line(result.stderr)


def test_unmigrated_schema_is_one_line_and_exit_1(dsn: str, schema: str) -> None:
    result = run_tenure(["exec", "--key", "job", "--", "true"], tenure_env(dsn, schema))
    assert result.returncode == 1
    assert "tenure migrate" in _one_line(result.stderr)


def test_help_lists_exit_codes_and_environment_twins(env: dict[str, str]) -> None:
    result = run_tenure(["exec", "--help"], env)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for needle in (
        "75 the lease was lost",
        "127 the command was not found",
        "126",
        "128+N",
        "TENURE_EXEC_TTL",
        "TENURE_EXEC_GRACE",
        "TENURE_EXEC_SLOT",
        "TENURE_EXEC_EVERY",
        "TENURE_EXEC_WAIT",
        "TENURE_EXEC_BUSY_EXIT",
        "TENURE_EXEC_KEY",
        "TENURE_JOB_KEY",
        "TENURE_FENCING_TOKEN",
        "TENURE_LEASE_OWNER",
        # Issue 31: the synopsis said --slot and --every exclude each other; together they
        # name the slot VALUE@<the period's slot> (test_every_slot_is_never_run_...).
        "With --every: VALUE@",
    ):
        assert needle in text, needle


# -- the library inside `tenure exec` -------------------------------------------------------


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_python_child_of_exec_connects_to_the_schema_exec_names(
    dsn: str, schema: str, client: tenure.Client, flavour: str
) -> None:
    """`tenure exec --schema S` exports $TENURE_SCHEMA to its command; a Python child's
    tenure.connect() / connect_async() without a schema argument use it, so its fenced write
    lands in S with exec's token (it went to schema 'tenure' before: TokenNotIssued there)."""
    env = tenure_env(dsn, schema)
    env.pop("TENURE_SCHEMA")  # named by the flag only: exec exports it to the child
    if flavour == "async":
        code = (
            "import asyncio, os, tenure\n"
            "token = int(os.environ['TENURE_FENCING_TOKEN'])\n"
            "async def main():\n"
            "    c = await tenure.connect_async()\n"
            "    await c.results.put('job', {'by': 'child'}, token=token)\n"
            "    await c.close()\n"
            "asyncio.run(main())\n"
        )
    else:
        code = (
            "import os, tenure\n"
            "token = int(os.environ['TENURE_FENCING_TOKEN'])\n"
            "with tenure.connect() as c:\n"
            "    c.results.put('job', {'by': 'child'}, token=token)\n"
        )
    result = subprocess.run(
        [PY, "-m", "tenure", "exec", "--schema", schema, "--key", "job", "--", PY, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    assert result.returncode == 0, result.stderr
    stored = client.results.get("job")
    assert stored is not None and stored.payload == {"by": "child"}
    assert stored.token == client.inspect("job").token  # type: ignore[union-attr]


def test_an_explicit_schema_comes_before_the_environment(
    dsn: str, schema: str, client: tenure.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENURE_SCHEMA", "not_this_one")
    with tenure.connect(dsn, schema=schema) as c:
        assert c.schema == schema
    monkeypatch.setenv("TENURE_SCHEMA", schema)
    with tenure.connect(dsn) as c:
        assert c.schema == schema
    monkeypatch.setenv("TENURE_SCHEMA", "")
    with tenure.connect(dsn) as c:
        assert c.schema == "tenure"  # unset or empty: the default, as for the commands
