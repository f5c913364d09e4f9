"""The run's own tables, next to tenure's in the run's schema.

* ``chaos_ledger``: the business table a fenced transaction writes (one row per accepted
  ledger write). The row is inserted *after* ``tenure.fence`` in the same transaction, and
  fenced transactions on one key serialise on the fence row's lock, so for one key the
  ``id`` order (allocated at insert) is the commit order.
* ``chaos_takeovers``: every committed takeover (a row trigger on ``job_leases``), the
  ground truth of which tokens were issued, including those whose acquire outcome the
  worker never learned.
* ``chaos_results_history``: every version ``report_results`` ever took, appended by an
  AFTER row trigger. The trigger runs after the upsert locked the row, and upserts of one
  key serialise on that lock, so for one key the ``id`` order is the commit order. A
  rolled-back or refused upsert leaves no history row.

Each row's ``xmin`` is the transaction that wrote it; with ``track_commit_timestamp = on``
(set on servers the run starts) ``pg_xact_commit_timestamp(xmin)`` orders a fenced ledger
commit against the takeovers: the strict-fencing check.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import psycopg

from tenure.db.queries import compose

SETUP = """
CREATE TABLE IF NOT EXISTS {schema}.chaos_ledger (
    id       bigserial   PRIMARY KEY,
    job_key  text        NOT NULL,
    token    bigint      NOT NULL,
    wid      text        NOT NULL UNIQUE,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {schema}.chaos_results_history (
    id       bigserial   PRIMARY KEY,
    job_key  text        NOT NULL,
    token    bigint      NOT NULL,
    wid      text,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {schema}.chaos_takeovers (
    id       bigserial   PRIMARY KEY,
    job_key  text        NOT NULL,
    token    bigint      NOT NULL,
    owner    uuid        NOT NULL,
    at       timestamptz NOT NULL
);
CREATE OR REPLACE FUNCTION {schema}.chaos_record_takeover() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fencing_token IS DISTINCT FROM OLD.fencing_token THEN
        INSERT INTO {schema}.chaos_takeovers (job_key, token, owner, at)
        VALUES (NEW.job_key, NEW.fencing_token, NEW.lease_owner, NEW.acquired_at);
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_record_takeover ON {schema}.job_leases;
CREATE TRIGGER chaos_record_takeover AFTER INSERT OR UPDATE ON {schema}.job_leases
FOR EACH ROW EXECUTE FUNCTION {schema}.chaos_record_takeover();
CREATE OR REPLACE FUNCTION {schema}.chaos_record_result() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.chaos_results_history (job_key, token, wid)
    VALUES (NEW.job_key, NEW.applied_fencing_token, NEW.payload->>'wid');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_record_result ON {schema}.report_results;
CREATE TRIGGER chaos_record_result AFTER INSERT OR UPDATE ON {schema}.report_results
FOR EACH ROW EXECUTE FUNCTION {schema}.chaos_record_result();
"""

LEDGER_INSERT = """
INSERT INTO {schema}.chaos_ledger (job_key, token, wid)
VALUES (%(key)s, %(token)s, %(wid)s)
RETURNING id, at
"""

# --no-fence: what a naive application does, the last writer wins whatever its token.
UNFENCED_RESULT = """
INSERT INTO {schema}.report_results AS r (job_key, payload, applied_fencing_token, written_at)
VALUES (%(key)s, %(payload)s, %(token)s, clock_timestamp())
ON CONFLICT (job_key) DO UPDATE
SET payload = excluded.payload,
    applied_fencing_token = excluded.applied_fencing_token,
    written_at = excluded.written_at
RETURNING applied_fencing_token, written_at
"""


def setup(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create the run's tables (tenure's schema must be migrated first)."""
    conn.execute(compose(SETUP, schema))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def snapshot(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[dict[str, Any]]]:
    """The tables the checker reads, as JSON-able rows."""

    def rows(template: str) -> list[dict[str, Any]]:
        cur = conn.execute(compose(template, schema))
        names = [d.name for d in cur.description or []]
        return [{n: _jsonable(v) for n, v in zip(names, r, strict=True)} for r in cur.fetchall()]

    row = conn.execute(b"SELECT current_setting('track_commit_timestamp') = 'on'").fetchone()
    committed = "pg_xact_commit_timestamp(xmin)" if row and row[0] else "NULL::timestamptz"

    def table(name: str) -> list[dict[str, Any]]:
        return rows(f"SELECT *, {committed} AS committed_at FROM {{schema}}.{name} ORDER BY id")

    return {
        "ledger": table("chaos_ledger"),
        "results_history": table("chaos_results_history"),
        "takeovers": table("chaos_takeovers"),
        "results": rows(
            "SELECT job_key, applied_fencing_token AS token, payload->>'wid' AS wid "
            "FROM {schema}.report_results ORDER BY job_key"
        ),
        "leases": rows(
            "SELECT job_key, fencing_token AS token, lease_until FROM {schema}.job_leases "
            "ORDER BY job_key"
        ),
    }
