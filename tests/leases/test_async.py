"""The asyncio flavour: the same operations as coroutines, and a lease that cancels its body.

The sync code is generated from the async source, so parity is structural; these tests
check that both flavours behave the same on a real database.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import tenure

ROOT = Path(__file__).resolve().parents[2]


def test_generated_sync_code_is_up_to_date() -> None:
    # tools/async_to_sync.py formats what it generates with ruff (a dev tool): without it
    # there is nothing to compare (a wheel-only install, scripts/release-checks).
    exe = Path(sys.executable).parent / "ruff"
    if not exe.is_file() and shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (next to this Python or on PATH)")
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "async_to_sync.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def _scenario(dsn: str, schema: str) -> list[object]:
    seen: list[object] = []
    async with await tenure.connect_async(dsn, schema=schema, migrate=True) as client:
        a = await client.acquire("job", ttl=0.2)
        assert a is not None
        seen.append(a.token)
        seen.append(await client.acquire("job", ttl=0.2))
        await asyncio.sleep(0.25)
        b = await client.acquire("job", ttl=5)
        assert b is not None
        seen.append(b.token)
        await client.results.put("job", {"by": "b"}, token=b.token)
        try:
            await client.results.put("job", {"by": "a"}, token=a.token)
        except tenure.StaleTokenError as exc:
            seen.append(("stale", exc.token, exc.current_token))
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            try:
                async with conn.transaction():
                    await tenure.fence_async(conn, "job", a.token, schema=schema)
            except tenure.StaleTokenError as exc:
                seen.append(("fence stale", exc.token, exc.current_token))
            async with conn.transaction():
                await tenure.fence_async(conn, "job", b.token, schema=schema)
        stored = await client.results.get("job")
        assert stored is not None
        seen.append(stored.payload)
        info = await client.inspect("job")
        assert info is not None
        seen.append((info.token, info.held))
    return seen


def _sync_scenario(dsn: str, schema: str) -> list[object]:
    import time

    seen: list[object] = []
    with tenure.connect(dsn, schema=schema, migrate=True) as client:
        a = client.acquire("job", ttl=0.2)
        assert a is not None
        seen.append(a.token)
        seen.append(client.acquire("job", ttl=0.2))
        time.sleep(0.25)
        b = client.acquire("job", ttl=5)
        assert b is not None
        seen.append(b.token)
        client.results.put("job", {"by": "b"}, token=b.token)
        try:
            client.results.put("job", {"by": "a"}, token=a.token)
        except tenure.StaleTokenError as exc:
            seen.append(("stale", exc.token, exc.current_token))
        with psycopg.connect(dsn) as conn:
            try:
                with conn.transaction():
                    tenure.fence(conn, "job", a.token, schema=schema)
            except tenure.StaleTokenError as exc:
                seen.append(("fence stale", exc.token, exc.current_token))
            with conn.transaction():
                tenure.fence(conn, "job", b.token, schema=schema)
        stored = client.results.get("job")
        assert stored is not None
        seen.append(stored.payload)
        info = client.inspect("job")
        assert info is not None
        seen.append((info.token, info.held))
    return seen


def test_sync_and_async_behave_the_same(dsn: str, schema: str) -> None:
    expected = [1, None, 2, ("stale", 1, 2), ("fence stale", 1, 2), {"by": "b"}, (2, True)]
    assert asyncio.run(_scenario(dsn, schema + "_a")) == expected
    assert _sync_scenario(dsn, schema) == expected
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA {} CASCADE").format(psycopg.sql.Identifier(schema + "_a"))
        )


def test_async_lease_cancels_body_when_lost(dsn: str, schema: str) -> None:
    async def main() -> str:
        async with await tenure.connect_async(dsn, schema=schema, migrate=True) as client:
            try:
                async with client.lease("job", ttl=0.5) as lease:
                    await client.release("job")  # an operator expires it
                    await asyncio.sleep(10)  # cancelled by the next (refused) renewal
                    return "body ran to the end"
            except tenure.LeaseLost as exc:
                assert exc.token == lease.token
                # The cancellation was converted: this task is not left cancelling.
                task = asyncio.current_task()
                assert task is not None and task.cancelling() == 0
                return "lost: " + exc.reason
        return "unreachable"

    outcome = asyncio.run(asyncio.wait_for(main(), 5))
    assert outcome.startswith("lost: renewal refused")


def test_async_lease_renews_and_releases(dsn: str, schema: str) -> None:
    async def main() -> tuple[int, bool, bool]:
        async with await tenure.connect_async(dsn, schema=schema, migrate=True) as client:
            async with client.lease("job", ttl=0.3) as lease:
                await asyncio.sleep(1.0)
                held = not lease.lost
            info = await client.inspect("job")
            assert info is not None
            return lease.token, held, info.held

    assert asyncio.run(main()) == (1, True, False)


def test_async_busy_and_wait(dsn: str, schema: str) -> None:
    async def main() -> int:
        async with await tenure.connect_async(dsn, schema=schema, migrate=True) as client:
            holder = await client.acquire("job", ttl=0.4)
            assert holder is not None
            with pytest.raises(tenure.LeaseBusy):
                async with client.lease("job", ttl=5):
                    pass
            async with client.lease("job", ttl=5, wait=5) as lease:
                return lease.token

    assert asyncio.run(main()) == 2
