"""SQLAlchemy ORM writes bound to a tenure lease: they commit only while the lease's token is
the newest, together with an outbox message for the downstream system.

    TENURE_DSN=postgresql://... python app.py
"""

from __future__ import annotations

import os

from sqlalchemy import MetaData, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import tenure
from tenure.contrib.sqlalchemy import fence, outbox_enqueue

DSN = os.environ.get("TENURE_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
SCHEMA = os.environ.get("TENURE_SCHEMA", "tenure")


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class Invoice(Base):
    __tablename__ = "invoices"
    id: Mapped[int] = mapped_column(primary_key=True)
    number: Mapped[str] = mapped_column(String(20), unique=True)


def main() -> None:
    # The engine must use psycopg 3: postgresql+psycopg://
    engine = create_engine(DSN.replace("postgresql://", "postgresql+psycopg://", 1))
    with tenure.connect(DSN, schema=SCHEMA, migrate=True) as client:
        Base.metadata.create_all(engine)
        with client.lease("sync-invoices", ttl="30s") as lease:
            with Session(engine) as session, session.begin():
                session.add(Invoice(number=f"INV-{lease.token}"))
                # Commits with the ORM insert, or raises StaleTokenError (and rolls it back)
                # if another process has taken the lease over meanwhile.
                fence(session, lease.job_key, lease.token, schema=SCHEMA)
                outbox_enqueue(
                    session,
                    "invoices",
                    f"INV-{lease.token}",
                    {"token": lease.token},
                    schema=SCHEMA,
                )
            print(f"committed INV-{lease.token} with token {lease.token}")
    engine.dispose()


if __name__ == "__main__":
    main()
