"""tenure.contrib.sqlalchemy: ORM writes commit with the fence or not at all, sync and async;
the outbox message exists iff the ORM transaction committed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from sqlalchemy import Engine, MetaData, String, create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import tenure
from tenure.contrib.sqlalchemy import (
    fence,
    fence_async,
    outbox_enqueue,
    outbox_enqueue_async,
)

KEY = "sync-invoices"


def url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def model(client: tenure.Client, schema: str) -> type[Any]:
    """An ORM model whose table lives in the test's schema."""

    class Base(DeclarativeBase):
        metadata = MetaData(schema=schema)

    class Invoice(Base):
        __tablename__ = "invoices"
        id: Mapped[int] = mapped_column(primary_key=True)
        number: Mapped[str] = mapped_column(String(20))

    return Invoice


@pytest.fixture
def engine(dsn: str, model: type[Any]) -> Iterator[Engine]:
    engine = create_engine(url(dsn))
    model.metadata.create_all(engine)
    yield engine
    engine.dispose()


@asynccontextmanager
async def async_engine(dsn: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(url(dsn))
    try:
        yield engine
    finally:
        await engine.dispose()


def tokens(client: tenure.Client) -> tuple[int, int]:
    """A stale token and the current one: the first lease was taken over."""
    old = client.acquire(KEY)
    assert old is not None
    client.release(KEY)
    new = client.acquire(KEY)
    assert new is not None
    return old.token, new.token


def count(engine: Engine, model: type[Any]) -> int:
    with Session(engine) as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def outbox_keys(client: tenure.Client) -> list[str]:
    return [m.key for m in tenure.outbox.messages(client, state="all")]


def test_orm_insert_commits_with_a_current_token(
    client: tenure.Client, schema: str, engine: Engine, model: type[Any]
) -> None:
    _, current = tokens(client)
    with Session(engine) as session, session.begin():
        session.add(model(number="A-1"))  # flushed at commit, after the fence
        fence(session, KEY, current, schema=schema)
        assert outbox_enqueue(session, "invoices", "A-1", {"n": 1}, schema=schema)
    assert count(engine, model) == 1
    assert outbox_keys(client) == ["A-1"]


@pytest.mark.parametrize("flush_first", [False, True])
def test_orm_insert_rolls_back_with_a_stale_token(
    client: tenure.Client, schema: str, engine: Engine, model: type[Any], flush_first: bool
) -> None:
    stale, _ = tokens(client)
    with pytest.raises(tenure.StaleTokenError), Session(engine) as session, session.begin():
        session.add(model(number="A-2"))
        if flush_first:
            session.flush()  # the row is written before the fence: rolled back all the same
        outbox_enqueue(session, "invoices", "A-2", {"n": 2}, schema=schema)
        fence(session, KEY, stale, schema=schema)
    assert count(engine, model) == 0
    assert outbox_keys(client) == []


def test_core_connection_commit_as_you_go(
    client: tenure.Client, schema: str, engine: Engine, model: type[Any]
) -> None:
    stale, current = tokens(client)
    table = model.__table__
    with engine.connect() as conn:
        fence(conn, KEY, current, schema=schema)  # begins the transaction
        conn.execute(table.insert().values(number="C-1"))
        conn.commit()
        conn.execute(table.insert().values(number="C-2"))
        with pytest.raises(tenure.StaleTokenError):
            fence(conn, KEY, stale, schema=schema)
        conn.rollback()
    assert count(engine, model) == 1


def test_async_session_and_connection_current_and_stale(
    client: tenure.Client, schema: str, dsn: str, engine: Engine, model: Any
) -> None:
    stale, current = tokens(client)

    async def scenario() -> None:
        async with async_engine(dsn) as engine:
            async with AsyncSession(engine) as session, session.begin():
                session.add(model(number="B-1"))
                await fence_async(session, KEY, current, schema=schema)
                await outbox_enqueue_async(session, "invoices", "B-1", {"n": 1}, schema=schema)
            with pytest.raises(tenure.StaleTokenError):
                async with AsyncSession(engine) as session, session.begin():
                    session.add(model(number="B-2"))
                    await session.flush()
                    await outbox_enqueue_async(session, "invoices", "B-2", {}, schema=schema)
                    await fence_async(session, KEY, stale, schema=schema)
            async with engine.connect() as conn:
                await fence_async(conn, KEY, current, schema=schema)
                await conn.execute(model.__table__.insert().values(number="B-3"))
                await conn.commit()

    asyncio.run(scenario())
    assert count(engine, model) == 2
    assert outbox_keys(client) == ["B-1"]


def test_wrong_flavour_and_driver_say_what_to_use(
    client: tenure.Client, schema: str, dsn: str
) -> None:
    async def scenario() -> None:
        async with async_engine(dsn) as engine, AsyncSession(engine) as session:
            with pytest.raises(tenure.InvalidArgument, match="fence_async"):
                fence(session, KEY, 1, schema=schema)  # type: ignore[arg-type]

    asyncio.run(scenario())
    wrong = pytest.raises(tenure.ConfigurationError, match=r"postgresql\+psycopg://")
    with Session(create_engine("sqlite://")) as session, wrong:
        fence(session, KEY, 1, schema=schema)


def test_example_commits_the_invoice_and_its_message(dsn: str, schema: str) -> None:
    import subprocess

    from ..support.examples import EXAMPLES, example_env, python

    env = example_env(dsn, schema)
    out = subprocess.run(
        python(str(EXAMPLES / "sqlalchemy" / "app.py")),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out == "committed INV-1 with token 1\n"
    with tenure.connect(dsn, schema=schema) as client:
        assert [m.key for m in tenure.outbox.messages(client)] == ["INV-1"]


AUTOCOMMIT_SAYS = r"isolation_level='AUTOCOMMIT'.*already committed"


@pytest.mark.parametrize("how", ["engine-session", "engine-connection", "execution-options"])
def test_autocommit_session_or_connection_is_refused_with_sqlalchemy_advice(
    client: tenure.Client, schema: str, dsn: str, engine: Engine, model: type[Any], how: str
) -> None:
    """Issue 31: on AUTOCOMMIT every statement commits on its own, so a write made before
    fence() is already committed when fence refuses. fence() and outbox_enqueue() refuse the
    session or connection in SQLAlchemy's terms (before: psycopg's `with
    conn.transaction():` advice for fence, and outbox_enqueue committed its message alone)."""
    _, current = tokens(client)
    auto = create_engine(url(dsn), isolation_level="AUTOCOMMIT")
    try:
        for call in (
            lambda bind: fence(bind, KEY, current, schema=schema),
            lambda bind: outbox_enqueue(bind, "invoices", "A-9", {}, schema=schema),
        ):
            with pytest.raises(tenure.InvalidArgument, match=AUTOCOMMIT_SAYS) as refused:
                if how == "engine-session":
                    with Session(auto) as session, session.begin():
                        call(session)
                elif how == "engine-connection":
                    with auto.connect() as conn:
                        call(conn)
                else:
                    with engine.connect() as conn:
                        call(conn.execution_options(isolation_level="AUTOCOMMIT"))
            assert "conn.transaction()" not in str(refused.value)
    finally:
        auto.dispose()
    assert outbox_keys(client) == []


def test_autocommit_async_session_is_refused_with_sqlalchemy_advice(
    client: tenure.Client, schema: str, dsn: str
) -> None:
    _, current = tokens(client)

    async def scenario() -> None:
        engine = create_async_engine(url(dsn), isolation_level="AUTOCOMMIT")
        try:
            async with AsyncSession(engine) as session, session.begin():
                with pytest.raises(tenure.InvalidArgument, match=AUTOCOMMIT_SAYS):
                    await fence_async(session, KEY, current, schema=schema)
                with pytest.raises(tenure.InvalidArgument, match=AUTOCOMMIT_SAYS):
                    await outbox_enqueue_async(session, "invoices", "B-9", {}, schema=schema)
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert outbox_keys(client) == []
