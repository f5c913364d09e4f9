"""What an application role needs on tenure's schema: the one list behind ``tenure grants``
(the GRANT statements) and ``tenure doctor`` (which of them the current role lacks).

The schema's owner runs ``tenure migrate``; an application role (workers, ``tenure exec``,
relays, ``tenure status``) needs only these. No sequence is listed: the identity columns
(``job_runs.run_id``, ``outbox.id``, ``lease_events.id``) need nothing beyond INSERT on
their table. The functions tenure calls are executable by everyone unless an administrator
revoked that, so ``tenure grants`` does not print them, but ``tenure doctor`` checks them.
``tests/db/test_privileges.py`` fails when a migration adds a table this list forgets.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql


@dataclass(frozen=True, slots=True)
class TableNeed:
    """The privileges tenure uses on one table, and what uses them."""

    table: str
    privileges: tuple[str, ...]
    used_by: str


TABLES: tuple[TableNeed, ...] = (
    TableNeed("tenure_migrations", ("SELECT",), "schema version checks (doctor, status, /readyz)"),
    TableNeed("job_leases", ("SELECT", "INSERT", "UPDATE"), "every lease: acquire, renew, release"),
    TableNeed(
        "job_state", ("SELECT", "INSERT", "UPDATE"), "fencing: acquire, fence(), strict writes"
    ),
    TableNeed("report_results", ("SELECT", "INSERT", "UPDATE"), "results.put/get, `tenure result`"),
    TableNeed(
        "exec_slots",
        ("SELECT", "INSERT", "DELETE"),
        "`tenure exec --slot/--every` (slots marked done; DELETE: retention)",
    ),
    TableNeed(
        "scheduled_jobs",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "`tenure worker` (registration, claims), `tenure jobs`, `tenure schedules` (DELETE: "
        "`jobs remove`, `schedules remove`)",
    ),
    TableNeed(
        "job_runs",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "`tenure worker` run history (DELETE: its retention) and `tenure jobs history`",
    ),
    TableNeed(
        "outbox",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "outbox.enqueue, `tenure relay`, `tenure outbox` (DELETE: `outbox purge`, retention)",
    ),
    TableNeed(
        "inbox", ("SELECT", "INSERT", "DELETE"), "tenure.inbox.claim (consumers; DELETE: retention)"
    ),
    TableNeed(
        "outbox_relays",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "`tenure relay` (the topics each live relay handles), `tenure outbox list`",
    ),
    TableNeed(
        "scheduler_workers",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "`tenure worker` (the job keys each live worker defines), `tenure jobs`",
    ),
    TableNeed(
        "exec_runs",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "`tenure exec` run history (DELETE: retention), `tenure status`",
    ),
    TableNeed(
        "schedule_tasks",
        ("SELECT", "INSERT", "UPDATE"),
        "`tenure worker` (the tasks of @app.task), `tenure schedules add` (unknown tasks)",
    ),
    TableNeed(
        "lease_events",
        ("SELECT", "INSERT", "DELETE"),
        "every acquire (a takeover's record), refused results.put and fence() writes, the "
        "dashboard's timeline of a bare lease (DELETE: retention)",
    ),
    TableNeed(
        "schedule_changes",
        ("SELECT", "INSERT"),
        "every change of a runtime schedule (tenure.add_schedule, `tenure schedules`)",
    ),
)

#: Functions tenure's statements call that an administrator might have revoked from PUBLIC.
FUNCTIONS: tuple[tuple[str, str], ...] = (
    ("pg_catalog.pg_current_wal_lsn()", "acquire and claims (the token floor)"),
    ("pg_catalog.pg_walfile_name(pg_lsn)", "acquire and claims (the token floor)"),
    ("pg_catalog.pg_notify(text, text)", "wake-ups of workers and relays (NOTIFY)"),
)


def grant_statements(schema: str, role: str) -> list[str]:
    """The GRANT statements that give ``role`` what tenure needs on ``schema``: USAGE on the
    schema, then the privileges of :data:`TABLES`. Names are quoted identifiers."""
    schema_id = sql.Identifier(schema).as_string()
    role_id = sql.Identifier(role).as_string()
    lines = [f"GRANT USAGE ON SCHEMA {schema_id} TO {role_id};"]
    for need in TABLES:
        table = f"{schema_id}.{sql.Identifier(need.table).as_string()}"
        lines.append(f"GRANT {', '.join(need.privileges)} ON {table} TO {role_id};")
    return lines
