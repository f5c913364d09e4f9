-- The metrics server (tenure.observe): readiness and the gauges read from the database at
-- scrape time. Cluster-wide values, the same whichever process serves them. Every time is
-- the database clock. {schema} is substituted as an identifier.

-- name: observe_has_table
-- Whether the schema has this table yet: tenure_migrations (any tenure tables at all),
-- scheduled_jobs (the scheduler's).
SELECT EXISTS (
    SELECT 1 FROM pg_tables WHERE schemaname = %(schema)s AND tablename = %(table)s
);

-- name: observe_schema_version
SELECT max(version) FROM {schema}.tenure_migrations;

-- name: observe_jobs
-- Per scheduled job: its schedule (for the slot interval), whether it is paused (and whether
-- the scheduler quarantined it), when its
-- newest successful run finished, and how long it has gone without one. With no success in
-- the (pruned) history, the age counts from the oldest history row, else from the
-- registration: a lower bound, so an alert on it never fires early. The newest success is the
-- one with the highest token (each run is one takeover and tokens only go up; a success has
-- a start, so job_runs_run holds it); the oldest row, read only for a job without one
-- (LIMIT 1 keeps it a subquery run only then), the first of job_runs_window (the earliest
-- start, from the index alone).
SELECT j.job_key,
       j.cron,
       j.every,
       j.timezone,
       j.paused,
       j.quarantined_at IS NOT NULL AS quarantined,
       extract(epoch FROM s.finished_at)::float8 AS last_success,
       extract(epoch FROM clock_timestamp()
                          - coalesce(s.finished_at, f.recorded_at, j.defined_at))::float8
           AS since_success
FROM {schema}.scheduled_jobs AS j
LEFT JOIN LATERAL (
    SELECT r.finished_at
    FROM {schema}.job_runs AS r
    WHERE r.job_key = j.job_key AND r.started_at IS NOT NULL AND r.outcome = 'succeeded'
    ORDER BY r.token DESC
    LIMIT 1
) AS s ON true
LEFT JOIN LATERAL (
    SELECT r.recorded_at
    FROM {schema}.job_runs AS r
    WHERE s.finished_at IS NULL AND r.job_key = j.job_key
    ORDER BY r.recorded_at
    LIMIT 1
) AS f ON true
ORDER BY j.job_key;

-- name: observe_outbox
-- Per topic: messages waiting (pending, including those backing off before a retry), dead
-- ones (parked until `tenure outbox retry`) and the age of the oldest pending one.
SELECT topic,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'dead') AS dead,
       extract(epoch FROM clock_timestamp()
                          - min(created_at) FILTER (WHERE state = 'pending'))::float8
           AS oldest_pending_age
FROM {schema}.outbox
WHERE state IN ('pending', 'dead')
GROUP BY topic
ORDER BY topic;

-- name: observe_missing_privileges
-- `tenure doctor`: which privileges tenure needs (tenure.db.privileges) the current role
-- lacks. Tables are found in the catalog by name (no regclass cast of a name), so a schema
-- without USAGE is reported rather than an error; a table not created yet (an older schema)
-- is left to the schema check.
WITH ns AS (
    SELECT oid FROM pg_namespace WHERE nspname = %(schema)s
), need AS (
    SELECT * FROM unnest(%(tables)s::text[], %(privileges)s::text[]) AS n(tbl, privilege)
)
SELECT 'schema' AS kind, %(schema)s::text AS name, 'USAGE' AS privilege
FROM ns
WHERE NOT has_schema_privilege(ns.oid, 'USAGE')
UNION ALL
SELECT 'table', n.tbl, n.privilege
FROM need AS n
CROSS JOIN ns
JOIN pg_class AS c ON c.relnamespace = ns.oid AND c.relname = n.tbl
WHERE NOT has_table_privilege(c.oid, n.privilege)
UNION ALL
SELECT 'function', f.signature, 'EXECUTE'
FROM unnest(%(functions)s::text[]) AS f(signature)
WHERE NOT has_function_privilege(f.signature, 'EXECUTE');

-- name: observe_history_memory
-- tenure doctor's memory check: how many unpaused scheduled jobs there are (each run's history
-- row goes into two indexes led by job_key, job_runs_run and _window: one leaf page per job
-- and index stays hot) against shared_buffers, in bytes. Only where
-- observe_has_table says scheduled_jobs is there.
SELECT (SELECT count(*) FROM {schema}.scheduled_jobs WHERE NOT paused) AS jobs,
       pg_size_bytes(current_setting('shared_buffers')) AS shared_buffers;

-- name: observe_server
-- Which server answered (through HAProxy or a multi-host DSN, the member that is primary
-- now) and on which WAL timeline: a failover moves both. inet_server_addr() is NULL over a
-- Unix socket. The timeline is the one tokens are floored on, read back from the floor itself
-- (queries.sql, token_floor: (timeline - 1) * 2^40 + 1); NULL on a standby.
SELECT current_setting('server_version') AS version,
       pg_is_in_recovery() AS standby,
       current_setting('default_transaction_read_only') AS read_only,
       host(inet_server_addr()) AS address,
       inet_server_port() AS port,
       CASE WHEN pg_is_in_recovery() THEN NULL
            ELSE ((({token_floor}) - 1) >> 40) + 1
       END AS timeline;
