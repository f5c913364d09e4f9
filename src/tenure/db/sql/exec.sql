-- Named queries of `tenure exec` (schedule slots). Same conventions as queries.sql.

-- name: exec_slot_check
-- The slot this run is for, and whether it already completed, in one round trip.
-- With %(every)s (whole seconds), the slot is the latest multiple of the period
-- (epoch-aligned, UTC) at or before the database clock plus %(early)s seconds, the early
-- tolerance, capped at half the period: a host whose cron fires a second before the boundary
-- still names the slot about to start, and flooring alone would put it in the previous slot
-- and run that twice; but no call runs a slot more than the tolerance before its time (plain
-- rounding would run a daily job up to 12 hours early). With %(slot)s too, the slot is
-- "VALUE@TIMESTAMP"; with %(slot)s only, it is VALUE.
-- Run again after the lease is taken (a new statement, so a new snapshot): a predecessor's
-- completion that committed while our takeover waited for its fence row is then visible.
-- open_until: the end of the slot's window (the next slot's time less the tolerance: from
-- then on every call names the next one), after which no run can name it again; NULL for a
-- slot named by the caller. Stored with the completed slot (exec_slot_done) so that
-- retention knows when the row can go.
WITH e AS (
    SELECT least(%(early)s::numeric, %(every)s::numeric / 2) AS early
), t AS (
    SELECT to_timestamp(floor((extract(epoch FROM clock_timestamp()) + e.early)
                              / %(every)s::numeric) * %(every)s::numeric) AS at,
           e.early
    FROM e
), s AS (
    SELECT concat_ws('@', %(slot)s::text,
                     to_char(t.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')) AS slot,
           t.at + make_interval(secs => %(every)s::numeric - t.early) AS open_until
    FROM t
)
-- can_record: whether this role may mark the slot done. Without it the slot could never be
-- recorded and would run again on every host, so exec refuses to run it (same round trip).
SELECT s.slot, d.token, d.completed_at, s.open_until,
       has_table_privilege(quote_ident(%(schema)s::text) || '.exec_slots', 'INSERT')
           AS can_record,
       current_user AS role
FROM s
LEFT JOIN {schema}.exec_slots AS d ON d.job_key = %(job_key)s AND d.slot = s.slot;

-- name: exec_slot_done
-- Mark a slot completed. Runs in a transaction that first called fence() with the run's
-- token: it commits only while that token is the newest takeover and its lease is unexpired,
-- and a successor's takeover waits for it (then sees the row in its post-acquire check).
-- open_until: see exec_slot_check (NULL: a caller-named slot, never pruned by age).
INSERT INTO {schema}.exec_slots (job_key, slot, token, completed_at, open_until)
VALUES (%(job_key)s, %(slot)s, %(token)s, clock_timestamp(), %(open_until)s)
ON CONFLICT (job_key, slot) DO NOTHING
RETURNING token;

-- name: exec_run_start
-- History for `tenure status`: the command is about to start under this token. Not fenced:
-- it is a record of what happened, and the lease was just taken with this token.
INSERT INTO {schema}.exec_runs (job_key, token, slot, host, pid, started_at, outcome)
VALUES (%(job_key)s, %(token)s, %(slot)s, %(host)s, %(pid)s, clock_timestamp(), 'running')
ON CONFLICT (job_key, token) DO NOTHING
RETURNING run_id;

-- name: exec_run_finish
-- The command ended (or was stopped when the lease was lost).
UPDATE {schema}.exec_runs
SET finished_at = clock_timestamp(), outcome = %(outcome)s, exit_code = %(exit_code)s,
    error = %(error)s
WHERE job_key = %(job_key)s AND token = %(token)s
RETURNING run_id;
