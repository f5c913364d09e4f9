-- Named queries of runtime schedules (src/tenure/scheduler/_async/runtime.py, migration 14):
-- scheduled_jobs rows that name a task and JSON arguments instead of being owned by a code
-- deploy. Each change is one statement, so it commits in the caller's transaction when the
-- caller passes its connection, records who made it (schedule_changes: current_user and
-- application_name) and notifies the workers (delivered at commit).

-- name: sched_register_tasks
-- The tasks app %(app)s's worker runs (@app.task). Tasks other workers of the app registered
-- are kept: a rolling deploy has old and new workers side by side.
INSERT INTO {schema}.schedule_tasks AS t (app, task, registered_at, registered_by)
SELECT %(app)s, name, clock_timestamp(), %(registered_by)s
FROM unnest(%(tasks)s::text[]) AS name
ORDER BY name
ON CONFLICT (app, task) DO UPDATE
SET registered_at = excluded.registered_at, registered_by = excluded.registered_by;

-- name: sched_tasks
-- Every app's registered tasks (a small table: apps times tasks).
SELECT app, array_agg(task ORDER BY task) FROM {schema}.schedule_tasks GROUP BY app ORDER BY app;

-- name: sched_define
-- Add or change runtime schedules, all of %(schedules)s (one JSON array) in one statement.
-- %(if_exists)s: 'error' (an existing key refuses the whole call), 'keep' (existing keys are
-- left as they are) or 'replace'. A key that is a coded job, or whose revision is no longer
-- %(expect)s's (an update that read an older definition), refuses the whole call: nothing is
-- written then, and the refused keys come back. Existing rows are locked first, in key
-- order. A replaced definition that is the same writes nothing; a changed one bumps the
-- revision (so a claim planned with the old one cannot start, see sched_start) and, if its
-- timing changed, restarts at its first slot after now (%(schedules)s' next_slot); a
-- change of the arguments alone keeps the next slot. A job claimed but not started is due
-- again at once. The fence row (token 0 until the first claim) is kept across a remove, so a
-- key added again keeps its token floor.
WITH incoming AS MATERIALIZED (
    SELECT *
    FROM json_to_recordset(%(schedules)s::json)
        AS i(job_key text, task text, args jsonb, cron text, every interval, timezone text,
             run_at timestamptz, starts_at timestamptz, ends_at timestamptz, jitter interval,
             max_runs integer, overlap text, misfire text, misfire_grace interval,
             on_crash text, ttl interval, quarantine_after integer, next_slot timestamptz,
             app text, expect integer)
    LIMIT %(count)s  -- the planner's row estimate (see sched_start)
), old AS MATERIALIZED (
    SELECT j.job_key, j.task, j.revision,
           jsonb_strip_nulls(jsonb_build_object(
               'task', j.task, 'args', j.args, 'cron', j.cron, 'every', j.every,
               'timezone', j.timezone, 'at', j.run_at, 'start', j.starts_at, 'end', j.ends_at,
               'jitter', j.jitter, 'max_runs', j.max_runs, 'overlap', j.overlap,
               'misfire', j.misfire, 'catch_up', j.misfire_grace, 'ttl', j.ttl, 'app', j.app,
               'revision', j.revision)) AS definition
    FROM {schema}.scheduled_jobs AS j
    WHERE j.job_key IN (SELECT job_key FROM incoming)
    ORDER BY j.job_key
    FOR UPDATE OF j
), refused AS MATERIALIZED (
    SELECT o.job_key,
           CASE WHEN o.task IS NULL THEN 'coded'
                WHEN i.expect IS NOT NULL AND i.expect <> o.revision THEN 'moved'
                ELSE 'exists' END AS why
    FROM old AS o
    JOIN incoming AS i ON i.job_key = o.job_key
    WHERE o.task IS NULL
       OR (i.expect IS NOT NULL AND i.expect <> o.revision)
       OR %(if_exists)s = 'error'
), upserted AS (
    INSERT INTO {schema}.scheduled_jobs AS j
        (job_key, task, args, cron, every, timezone, run_at, starts_at, ends_at, jitter,
         max_runs, overlap, ttl, misfire, misfire_grace, on_crash, quarantine_after,
         defined_at, defined_by, next_slot, app)
    SELECT i.job_key, i.task, i.args, i.cron, i.every, i.timezone, i.run_at, i.starts_at,
           i.ends_at, i.jitter, i.max_runs, i.overlap, i.ttl, i.misfire, i.misfire_grace,
           i.on_crash, i.quarantine_after, clock_timestamp(), %(defined_by)s, i.next_slot,
           i.app
    FROM incoming AS i
    WHERE NOT EXISTS (SELECT 1 FROM refused)
    ORDER BY i.job_key
    ON CONFLICT (job_key) DO UPDATE
    SET task = excluded.task,
        args = excluded.args,
        cron = excluded.cron,
        every = excluded.every,
        timezone = excluded.timezone,
        run_at = excluded.run_at,
        starts_at = excluded.starts_at,
        ends_at = excluded.ends_at,
        jitter = excluded.jitter,
        max_runs = excluded.max_runs,
        overlap = excluded.overlap,
        ttl = excluded.ttl,
        misfire = excluded.misfire,
        misfire_grace = excluded.misfire_grace,
        on_crash = excluded.on_crash,
        quarantine_after = excluded.quarantine_after,
        app = excluded.app,
        revision = j.revision + 1,
        defined_at = excluded.defined_at,
        defined_by = excluded.defined_by,
        next_slot = CASE
            WHEN (j.cron, j.every, j.timezone, j.run_at, j.starts_at, j.ends_at, j.jitter,
                  j.max_runs)
                 IS DISTINCT FROM (excluded.cron, excluded.every, excluded.timezone,
                                   excluded.run_at, excluded.starts_at, excluded.ends_at,
                                   excluded.jitter, excluded.max_runs)
            THEN excluded.next_slot ELSE j.next_slot END,
        -- Claimed, not started: its start is refused (revision), so it is due again now.
        held_until = CASE WHEN j.running_slot IS NULL THEN NULL ELSE j.held_until END
    WHERE %(if_exists)s = 'replace' AND j.task IS NOT NULL
      AND (j.task, j.args, j.cron, j.every, j.timezone, j.run_at, j.starts_at, j.ends_at,
           j.jitter, j.max_runs, j.overlap, j.ttl, j.misfire, j.misfire_grace, j.on_crash,
           j.quarantine_after, j.app)
          IS DISTINCT FROM (excluded.task, excluded.args, excluded.cron, excluded.every,
                            excluded.timezone, excluded.run_at, excluded.starts_at,
                            excluded.ends_at, excluded.jitter, excluded.max_runs,
                            excluded.overlap, excluded.ttl, excluded.misfire,
                            excluded.misfire_grace, excluded.on_crash,
                            excluded.quarantine_after, excluded.app)
    RETURNING j.job_key, j.revision, j.next_slot,
              jsonb_strip_nulls(jsonb_build_object(
                  'task', j.task, 'args', j.args, 'cron', j.cron, 'every', j.every,
                  'timezone', j.timezone, 'at', j.run_at, 'start', j.starts_at,
                  'end', j.ends_at, 'jitter', j.jitter, 'max_runs', j.max_runs,
                  'overlap', j.overlap, 'misfire', j.misfire, 'catch_up', j.misfire_grace,
                  'ttl', j.ttl, 'app', j.app, 'revision', j.revision)) AS definition
), state AS (
    INSERT INTO {schema}.job_state (job_key, token)
    SELECT job_key, 0 FROM upserted
    ORDER BY job_key
    ON CONFLICT (job_key) DO NOTHING
), changes AS (
    INSERT INTO {schema}.schedule_changes
        (job_key, action, role, application_name, before, after)
    SELECT u.job_key, CASE WHEN o.job_key IS NULL THEN 'add' ELSE %(action)s END,
           current_user, current_setting('application_name'), o.definition, u.definition
    FROM upserted AS u
    LEFT JOIN old AS o ON o.job_key = u.job_key
    ORDER BY u.job_key
)
SELECT u.job_key, CASE WHEN o.job_key IS NULL THEN 'added' ELSE 'changed' END AS outcome,
       u.revision, u.next_slot
FROM upserted AS u
LEFT JOIN old AS o ON o.job_key = u.job_key
UNION ALL
SELECT r.job_key, 'refused:' || r.why, NULL, NULL FROM refused AS r
UNION ALL
SELECT NULL, pg_notify(%(channel)s, 'schedules')::text, NULL, NULL
WHERE EXISTS (SELECT 1 FROM upserted);

-- name: sched_remove
-- Remove runtime schedules (never a coded job: those come back as refused). The lease and
-- fence rows stay: a key added again keeps its token floor. A run already going finishes
-- under its token (sched_finish keeps its outcome); no new run starts (sched_start finds no
-- job row).
WITH gone AS (
    DELETE FROM {schema}.scheduled_jobs AS j
    WHERE j.job_key = ANY (%(keys)s::text[]) AND j.task IS NOT NULL
    RETURNING j.job_key,
              jsonb_strip_nulls(jsonb_build_object(
                  'task', j.task, 'args', j.args, 'cron', j.cron, 'every', j.every,
                  'timezone', j.timezone, 'at', j.run_at, 'start', j.starts_at,
                  'end', j.ends_at, 'jitter', j.jitter, 'max_runs', j.max_runs,
                  'overlap', j.overlap, 'misfire', j.misfire, 'catch_up', j.misfire_grace,
                  'ttl', j.ttl, 'app', j.app, 'revision', j.revision)) AS definition
), changes AS (
    INSERT INTO {schema}.schedule_changes
        (job_key, action, role, application_name, before, after)
    SELECT g.job_key, 'remove', current_user, current_setting('application_name'),
           g.definition, NULL
    FROM gone AS g
)
SELECT g.job_key, 'removed' FROM gone AS g
UNION ALL
SELECT j.job_key, 'refused:coded' FROM {schema}.scheduled_jobs AS j
WHERE j.job_key = ANY (%(keys)s::text[]) AND j.task IS NULL
UNION ALL
SELECT NULL, pg_notify(%(channel)s, 'schedules')::text WHERE EXISTS (SELECT 1 FROM gone);

-- name: sched_schedules
-- Runtime schedules a page at a time, by key after %(after)s, those whose key or task
-- contains %(search)s (NULL: all).
SELECT j.job_key, j.task, j.args, j.cron, j.every, j.timezone, j.run_at, j.starts_at,
       j.ends_at, j.jitter, j.max_runs, j.runs_started, j.overlap, j.misfire, j.misfire_grace,
       j.ttl, j.app, j.revision, j.paused, j.pause_note, j.next_slot, j.running_slot,
       j.backfill_next, j.backfill_to, j.defined_at, j.defined_by, j.on_crash,
       j.quarantine_after, clock_timestamp() AS now
FROM {schema}.scheduled_jobs AS j
WHERE j.task IS NOT NULL
  AND (%(keys)s::text[] IS NULL OR j.job_key = ANY (%(keys)s::text[]))
  AND j.job_key > %(after)s
  AND (%(search)s::text IS NULL OR strpos(j.job_key, %(search)s) > 0
       OR strpos(j.task, %(search)s) > 0)
ORDER BY j.job_key
LIMIT %(limit)s;

-- name: sched_schedule_changes
SELECT change_id, job_key, action, role, application_name, changed_at, before, after
FROM {schema}.schedule_changes
WHERE job_key = %(job_key)s
ORDER BY change_id DESC
LIMIT %(limit)s;

-- name: sched_backfill
-- Run the slots %(first)s .. %(last)s of a job once each, oldest first, as runs of kind
-- 'backfill' (each with its own token, fenced like any other run); replaces a backfill in
-- progress.
WITH old AS MATERIALIZED (
    SELECT j.job_key, j.backfill_next, j.backfill_to FROM {schema}.scheduled_jobs AS j
    WHERE j.job_key = %(job_key)s
    FOR UPDATE
), changed AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET backfill_next = %(first)s, backfill_to = %(last)s
    FROM old AS o
    WHERE j.job_key = o.job_key
    RETURNING j.job_key
), changes AS (
    INSERT INTO {schema}.schedule_changes
        (job_key, action, role, application_name, before, after)
    SELECT o.job_key, 'backfill', current_user, current_setting('application_name'),
           jsonb_strip_nulls(jsonb_build_object('backfill_next', o.backfill_next,
                                                'backfill_to', o.backfill_to)),
           jsonb_build_object('backfill_next', %(first)s::timestamptz,
                              'backfill_to', %(last)s::timestamptz)
    FROM old AS o
)
SELECT c.job_key, pg_notify(%(channel)s, 'backfill')::text FROM changed AS c;

-- name: sched_schedule_pause
-- Pause a runtime schedule with an operator's note (or change the note of a paused one):
-- no run starts after this commits (sched_start refuses a paused job); one going finishes.
WITH old AS MATERIALIZED (
    SELECT j.job_key, j.paused, j.pause_note FROM {schema}.scheduled_jobs AS j
    WHERE j.job_key = %(job_key)s AND j.task IS NOT NULL
    FOR UPDATE
), changed AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET paused = true, paused_at = CASE WHEN o.paused THEN j.paused_at ELSE clock_timestamp() END,
        pause_note = %(note)s
    FROM old AS o
    WHERE j.job_key = o.job_key
    RETURNING j.job_key
), changes AS (
    INSERT INTO {schema}.schedule_changes
        (job_key, action, role, application_name, before, after)
    SELECT o.job_key, 'pause', current_user, current_setting('application_name'),
           jsonb_strip_nulls(jsonb_build_object('paused', o.paused, 'note', o.pause_note)),
           jsonb_strip_nulls(jsonb_build_object('paused', true, 'note', %(note)s::text))
    FROM old AS o
)
SELECT o.paused AS was_paused, pg_notify(%(channel)s, 'paused')::text FROM old AS o;

-- name: sched_schedule_resume
-- Resume a paused runtime schedule from %(next_slot)s (the first slot after now of revision
-- %(revision)s, computed by the caller): slots that passed while it was paused are not run.
WITH old AS MATERIALIZED (
    SELECT j.job_key, j.pause_note FROM {schema}.scheduled_jobs AS j
    WHERE j.job_key = %(job_key)s AND j.task IS NOT NULL AND j.paused
      AND j.revision = %(revision)s
    FOR UPDATE
), changed AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET paused = false, paused_at = NULL, pause_note = NULL,
        next_slot = greatest(j.next_slot, %(next_slot)s),
        quarantined_at = NULL, quarantine_reason = NULL, crash_streak = 0
    FROM old AS o
    WHERE j.job_key = o.job_key
    RETURNING j.job_key, j.next_slot
), changes AS (
    INSERT INTO {schema}.schedule_changes
        (job_key, action, role, application_name, before, after)
    SELECT o.job_key, 'resume', current_user, current_setting('application_name'),
           jsonb_strip_nulls(jsonb_build_object('paused', true, 'note', o.pause_note)),
           jsonb_build_object('paused', false)
    FROM old AS o
)
SELECT c.next_slot, pg_notify(%(channel)s, 'resumed')::text FROM changed AS c;
