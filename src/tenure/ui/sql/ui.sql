-- Named queries of the web dashboard (tenure.ui). Read-only; each runs in a READ ONLY
-- transaction with a statement timeout. Every time is the database clock.
-- {schema} is substituted as an identifier. Sort keys and filters are parameters compared
-- in CASE expressions: no SQL text is ever built from a request.

-- name: ui_clock
SELECT clock_timestamp();

-- fragment: last_run
-- A job's last run, for the overview and the jobs list (which must agree on which jobs are
-- failing), of the job `j`: its newest run that started and has ended, as `tenure status`
-- reads it (status.sql). Newest = highest token: each run is one takeover, and tokens only
-- go up. One backward step per job on job_runs_run (job_key, token), which holds every
-- started run and no skipped slot's row. Before migration 19 it was the newest row by run_id
-- (skipped slots' aside), the same run but after a start that gave a crashed run's slot up
-- without running it: that slot's 'abandoned' record (never started) was the last then; the
-- crashed run is now (its row is written by the same statement). Walking job_runs_window by
-- recorded_at instead cost a third more CPU per job for the same pages (bench/README.md,
-- "Twelfth pass").
LEFT JOIN LATERAL (
    SELECT r.outcome, coalesce(r.finished_at, r.recorded_at) AS finished_at, r.token
    FROM {schema}.job_runs AS r
    WHERE r.job_key = j.job_key AND r.started_at IS NOT NULL AND r.outcome <> 'running'
    ORDER BY r.token DESC
    LIMIT 1
) AS last ON true

-- name: ui_overview_jobs
-- Jobs by state, each in one state by the jobs list's precedence (quarantined, paused,
-- running, failing, idle: scheduler.jobs.job_state), so the tiles add up to the total;
-- "overdue" is the exception, a subset of the others, and its tile says so. "running": a run is in progress (or unfinished: its holder died and the
-- slot waits for a retry). "failing": the newest finished run failed. "quarantined": paused
-- by the scheduler after runs whose worker died (migration 5). "overdue": not paused,
-- nothing running or triggered, and its next slot passed more than a minute ago: no worker
-- is claiming it (none runs, or none has its function).
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
)
SELECT count(*) AS total,
       count(*) FILTER (WHERE j.paused AND j.quarantined_at IS NULL) AS paused,
       count(*) FILTER (WHERE NOT j.paused AND j.running_slot IS NOT NULL) AS running,
       count(*) FILTER (WHERE NOT j.paused AND j.running_slot IS NULL
                          AND last.outcome = 'failed') AS failing,
       count(*) FILTER (WHERE NOT j.paused AND j.running_slot IS NULL AND j.trigger_at IS NULL
                          AND j.next_slot < c.now - interval '1 minute') AS overdue,
       count(*) FILTER (WHERE j.quarantined_at IS NOT NULL) AS quarantined
FROM {schema}.scheduled_jobs AS j
CROSS JOIN clock AS c
{last_run};

-- name: ui_overview_leases
SELECT count(*) AS total,
       count(*) FILTER (WHERE lease_until >= clock_timestamp()) AS held
FROM {schema}.job_leases;

-- name: ui_overview_events
-- Run outcomes recorded since %(since)s (a run's row is recorded when it starts). The caller
-- passes the window's start, computed from ui_clock: compared with clock_timestamp() (or a
-- subquery on it) the planner cannot estimate the range and scans the whole history.
-- `tenure exec` runs (exec_runs, by exec_runs_recorded) count as runs too.
SELECT sum(stale)::bigint AS stale, sum(lost)::bigint AS lost, sum(failed)::bigint AS failed,
       sum(runs)::bigint AS runs, sum(execs)::bigint AS execs
FROM (
    SELECT count(*) FILTER (WHERE outcome = 'stale_rejected') AS stale,
           count(*) FILTER (WHERE outcome = 'lease_lost') AS lost,
           count(*) FILTER (WHERE outcome = 'failed') AS failed,
           count(*) FILTER (WHERE started_at IS NOT NULL) AS runs,
           0 AS execs
    FROM {schema}.job_runs
    WHERE recorded_at >= %(since)s
    UNION ALL
    SELECT 0, count(*) FILTER (WHERE outcome = 'lease_lost'),
           count(*) FILTER (WHERE outcome = 'failed'), count(*), count(*)
    FROM {schema}.exec_runs
    WHERE recorded_at >= %(since)s
) AS both_kinds;

-- name: ui_overview_incidents
-- The newest stale rejections, lost leases and failures since %(since)s, for the overview.
-- `tenure exec` runs' failures and lost leases too.
(SELECT job_key, token, outcome, coalesce(finished_at, recorded_at) AS at,
        worker_id AS worker, error
 FROM {schema}.job_runs
 WHERE recorded_at >= %(since)s
   AND outcome IN ('stale_rejected', 'lease_lost', 'failed')
 ORDER BY recorded_at DESC
 LIMIT 20)
UNION ALL
(SELECT job_key, token, outcome, coalesce(finished_at, recorded_at), 'tenure exec',
        coalesce(error, 'exit code ' || nullif(exit_code, 0))
 FROM {schema}.exec_runs
 WHERE recorded_at >= %(since)s AND outcome IN ('lease_lost', 'failed')
 ORDER BY recorded_at DESC
 LIMIT 20)
ORDER BY at DESC
LIMIT 20;

-- name: ui_outbox_topics
-- Per topic: pending (including those backing off), dead, oldest pending age.
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

-- name: ui_outbox_dead
SELECT id, topic, key, attempts, last_error, last_attempt_at, created_at, job_key, token
FROM {schema}.outbox
WHERE state = 'dead'
ORDER BY id DESC
LIMIT %(limit)s;

-- name: ui_jobs_page
-- One page of jobs, filtered and sorted on scheduled_jobs' own columns (no per-job history
-- lookup before the LIMIT: with 10,000 jobs, only the page's rows read their last run).
-- %(state)s: 'all', 'paused', 'quarantined' or 'running' here ('failing'/'idle' use
-- ui_jobs_by_last).
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), page AS (
    SELECT j.*, count(*) OVER () AS total
    FROM {schema}.scheduled_jobs AS j
    WHERE (%(search)s::text IS NULL OR strpos(lower(j.job_key), lower(%(search)s::text)) > 0)
      AND (%(state)s::text = 'all'
           OR (%(state)s::text = 'paused' AND j.paused AND j.quarantined_at IS NULL)
           OR (%(state)s::text = 'quarantined' AND j.quarantined_at IS NOT NULL)
           OR (%(state)s::text = 'running' AND NOT j.paused AND j.running_slot IS NOT NULL))
    ORDER BY
        CASE WHEN %(sort)s::text = 'next' AND %(desc)s::boolean THEN j.next_slot END DESC,
        CASE WHEN %(sort)s::text = 'next' AND NOT %(desc)s::boolean THEN j.next_slot END,
        CASE WHEN %(desc)s::boolean THEN j.job_key END DESC,
        j.job_key
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT j.job_key, j.cron, j.every, j.timezone, j.paused, j.next_slot, j.running_slot,
       j.trigger_at IS NOT NULL AS triggered, l.fencing_token, l.lease_until,
       coalesce(l.lease_until >= c.now, false) AS held,
       last.outcome, last.finished_at, last.token, j.total, c.now, j.quarantined_at
FROM page AS j
CROSS JOIN clock AS c
LEFT JOIN {schema}.job_leases AS l ON l.job_key = j.job_key
{last_run}
ORDER BY
    CASE WHEN %(sort)s::text = 'next' AND %(desc)s::boolean THEN j.next_slot END DESC,
    CASE WHEN %(sort)s::text = 'next' AND NOT %(desc)s::boolean THEN j.next_slot END,
    CASE WHEN %(desc)s::boolean THEN j.job_key END DESC,
    j.job_key;

-- name: ui_jobs_by_last
-- One page of jobs when the filter or the sort needs every job's last run (state 'failing'
-- or 'idle', sort 'last'): one backward index step per job on job_runs_run (last_run).
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), base AS (
    SELECT j.job_key, j.cron, j.every, j.timezone, j.paused, j.next_slot, j.running_slot,
           j.trigger_at IS NOT NULL AS triggered, last.outcome, last.finished_at, last.token,
           j.quarantined_at
    FROM {schema}.scheduled_jobs AS j
    {last_run}
    WHERE (%(search)s::text IS NULL OR strpos(lower(j.job_key), lower(%(search)s::text)) > 0)
), page AS (
    SELECT b.*, count(*) OVER () AS total
    FROM base AS b
    WHERE %(state)s::text = 'all'
       OR (%(state)s::text = 'paused' AND b.paused AND b.quarantined_at IS NULL)
       OR (%(state)s::text = 'quarantined' AND b.quarantined_at IS NOT NULL)
       OR (%(state)s::text = 'running' AND NOT b.paused AND b.running_slot IS NOT NULL)
       OR (%(state)s::text = 'failing' AND NOT b.paused AND b.running_slot IS NULL
           AND b.outcome = 'failed')
       OR (%(state)s::text = 'idle' AND NOT b.paused AND b.running_slot IS NULL
           AND b.outcome IS DISTINCT FROM 'failed')
    ORDER BY
        CASE WHEN %(sort)s::text = 'last' AND %(desc)s::boolean THEN b.finished_at END
            DESC NULLS LAST,
        CASE WHEN %(sort)s::text = 'last' AND NOT %(desc)s::boolean THEN b.finished_at END,
        CASE WHEN %(sort)s::text = 'next' AND %(desc)s::boolean THEN b.next_slot END DESC,
        CASE WHEN %(sort)s::text = 'next' AND NOT %(desc)s::boolean THEN b.next_slot END,
        CASE WHEN %(desc)s::boolean THEN b.job_key END DESC,
        b.job_key
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT p.job_key, p.cron, p.every, p.timezone, p.paused, p.next_slot, p.running_slot,
       p.triggered, l.fencing_token, l.lease_until,
       coalesce(l.lease_until >= c.now, false) AS held,
       p.outcome, p.finished_at, p.token, p.total, c.now, p.quarantined_at
FROM page AS p
CROSS JOIN clock AS c
LEFT JOIN {schema}.job_leases AS l ON l.job_key = p.job_key
ORDER BY
    CASE WHEN %(sort)s::text = 'last' AND %(desc)s::boolean THEN p.finished_at END
        DESC NULLS LAST,
    CASE WHEN %(sort)s::text = 'last' AND NOT %(desc)s::boolean THEN p.finished_at END,
    CASE WHEN %(sort)s::text = 'next' AND %(desc)s::boolean THEN p.next_slot END DESC,
    CASE WHEN %(sort)s::text = 'next' AND NOT %(desc)s::boolean THEN p.next_slot END,
    CASE WHEN %(desc)s::boolean THEN p.job_key END DESC,
    p.job_key;

-- name: ui_job
-- One key: its schedule (if scheduled), lease, fence row and stored result. Any key with a
-- lease or a schedule has a page (also leases taken by `tenure exec` or the library).
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
)
SELECT k.job_key, j.cron, j.every, j.timezone, j.ttl, j.paused, j.paused_at, j.next_slot,
       j.running_slot, j.running_token, j.trigger_at, j.defined_by, j.defined_at, j.revision,
       l.fencing_token, l.lease_owner, l.lease_until,
       coalesce(l.lease_until >= c.now, false) AS held, l.acquired_at,
       s.token AS fence_token, s.fenced_token, s.fenced_at,
       res.applied_fencing_token, res.written_at, res.payload::text AS payload,
       j.job_key IS NOT NULL AS scheduled, c.now, j.quarantined_at, j.quarantine_reason,
       j.crash_streak, j.app
FROM (SELECT %(job_key)s::text AS job_key) AS k
CROSS JOIN clock AS c
LEFT JOIN {schema}.scheduled_jobs AS j ON j.job_key = k.job_key
LEFT JOIN {schema}.job_leases AS l ON l.job_key = k.job_key
LEFT JOIN {schema}.job_state AS s ON s.job_key = k.job_key
LEFT JOIN {schema}.report_results AS res ON res.job_key = k.job_key
WHERE j.job_key IS NOT NULL OR l.job_key IS NOT NULL OR res.job_key IS NOT NULL;

-- name: ui_timeline
-- The runs of one job in the window, newest first, at most %(limit)s (job_runs_window), and
-- the run in progress whenever it started (scheduled_jobs.running_token, job_runs_run); and
-- the key's `tenure exec` runs in the window, as in ui_history.
(SELECT run_id, slot, kind, attempt, token, worker_id AS worker, host, pid, started_at,
        finished_at, outcome, error, recorded_at
 FROM {schema}.job_runs
 WHERE job_key = %(job_key)s AND recorded_at >= %(since)s
 ORDER BY recorded_at DESC
 LIMIT %(limit)s)
UNION
(SELECT r.run_id, r.slot, r.kind, r.attempt, r.token, r.worker_id, r.host, r.pid,
        r.started_at, r.finished_at, r.outcome, r.error, r.recorded_at
 FROM {schema}.scheduled_jobs AS j
 JOIN {schema}.job_runs AS r
   ON r.job_key = j.job_key AND r.token = j.running_token AND r.started_at IS NOT NULL
 WHERE j.job_key = %(job_key)s)
UNION
(SELECT -run_id, started_at, 'exec', 1, token, 'tenure exec', host, pid, started_at,
        finished_at, outcome, coalesce(error, 'exit code ' || nullif(exit_code, 0)), recorded_at
 FROM {schema}.exec_runs
 WHERE job_key = %(job_key)s AND recorded_at >= %(since)s
 ORDER BY recorded_at DESC
 LIMIT %(limit)s)
ORDER BY recorded_at, run_id;

-- name: ui_timeline_dense
-- A dense window (more runs than the timeline draws one by one), as counts and a few rows:
-- per time slice (date_bin: %(stride)s wide from %(since)s, by recorded_at) and outcome how
-- many runs and the worst lateness of a scheduled run (recorded_at is when a run started; a
-- skipped slot's row has no start: its "lateness" is ignored by the caller) (row_kind 'bin'),
-- from an index-only scan of job_runs_window (migration 9); and
-- the newest %(limit)s runs worth a bar of their own (row_kind 'run'): anything but a plain
-- success on its first attempt (failures, lost leases, refused writes, skips, unfinished
-- runs, and every retry: the successor of a takeover), from job_runs_notable, whose
-- predicate is this WHERE clause's; and the same for the key's `tenure exec` runs. Grouping by outcome (not one FILTER per class) and
-- date_bin (not width_bucket over epoch floats) keep 100,000 rows at a few ms of CPU.
(SELECT 'bin' AS row_kind, date_bin(%(stride)s::interval, recorded_at, %(since)s) AS bin,
        count(*) AS runs,
        extract(epoch FROM max(recorded_at - slot) FILTER (WHERE kind = 'scheduled'))::float8
            AS late,
        NULL::bigint AS run_id, NULL::timestamptz AS slot,
        NULL::text AS kind, NULL::integer AS attempt, NULL::bigint AS token,
        NULL::text AS worker, NULL::text AS host, NULL::integer AS pid,
        NULL::timestamptz AS started_at, NULL::timestamptz AS finished_at, outcome,
        NULL::text AS error, NULL::timestamptz AS recorded_at
 FROM {schema}.job_runs
 WHERE job_key = %(job_key)s AND recorded_at >= %(since)s
 GROUP BY 2, outcome)
UNION ALL
(SELECT 'run', NULL, NULL, NULL, run_id, slot, kind, attempt, token, worker_id, host, pid,
        started_at, finished_at, outcome, error, recorded_at
 FROM {schema}.job_runs
 WHERE job_key = %(job_key)s AND recorded_at >= %(since)s
   AND (outcome <> 'succeeded' OR attempt > 1)
 ORDER BY recorded_at DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT 'bin', date_bin(%(stride)s::interval, recorded_at, %(since)s), count(*), NULL,
        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, outcome, NULL, NULL
 FROM {schema}.exec_runs
 WHERE job_key = %(job_key)s AND recorded_at >= %(since)s
 GROUP BY 2, outcome)
UNION ALL
(SELECT 'run', NULL, NULL, NULL, -run_id, started_at, 'exec', 1, token, 'tenure exec', host,
        pid, started_at, finished_at, outcome, coalesce(error, 'exit code ' || nullif(exit_code, 0)),
        recorded_at
 FROM {schema}.exec_runs
 WHERE job_key = %(job_key)s AND recorded_at >= %(since)s AND outcome <> 'succeeded'
 ORDER BY recorded_at DESC
 LIMIT %(limit)s);

-- name: ui_history
-- The newest runs of one key: the scheduler's (job_runs) and `tenure exec`'s (exec_runs, as
-- runs of kind 'exec' whose slot is their start; their run_id negated, a sequence of its own).
-- Newest by recorded_at, the order the list is shown in (job_runs_window, newest first).
(SELECT run_id, slot, kind, attempt, token, worker_id AS worker, host, pid, started_at,
        finished_at, outcome, error, recorded_at
 FROM {schema}.job_runs
 WHERE job_key = %(job_key)s
 ORDER BY recorded_at DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT -run_id, started_at, 'exec', 1, token, 'tenure exec', host, pid, started_at,
        finished_at, outcome, coalesce(error, 'exit code ' || nullif(exit_code, 0)), recorded_at
 FROM {schema}.exec_runs
 WHERE job_key = %(job_key)s
 ORDER BY run_id DESC
 LIMIT %(limit)s)
ORDER BY recorded_at DESC
LIMIT %(limit)s;

-- name: ui_lease_events
-- A key's lease events (migration 18: its takeovers and refused writes), for the timeline of
-- a key without run history (a bare library lease): the newest %(limit)s in the window
-- (%(since)s NULL: the newest), by the primary key (job_key, id).
SELECT id, token, event, at, detail
FROM {schema}.lease_events
WHERE job_key = %(job_key)s AND (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: ui_leases
-- Every lease (scheduler, `tenure exec` or the library), live ones first.
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
)
SELECT l.job_key, l.lease_owner, l.fencing_token, l.lease_until,
       l.lease_until >= c.now AS held,
       extract(epoch FROM l.lease_until - c.now)::float8 AS seconds_left,
       l.lease_ttl, l.acquired_at, l.renewed_at, j.job_key IS NOT NULL AS scheduled,
       count(*) OVER () AS total, c.now
FROM {schema}.job_leases AS l
CROSS JOIN clock AS c
LEFT JOIN {schema}.scheduled_jobs AS j ON j.job_key = l.job_key
WHERE %(search)s::text IS NULL OR strpos(lower(l.job_key), lower(%(search)s::text)) > 0
ORDER BY (l.lease_until >= c.now) DESC, l.job_key
LIMIT %(limit)s OFFSET %(offset)s;

-- name: ui_other_keys
-- Keys with a lease and no schedule (`tenure exec` commands, the library's bare leases),
-- with their newest `tenure exec` run if any (exec_runs_history), for the jobs list.
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
)
SELECT l.job_key, l.fencing_token AS token, l.lease_until, l.lease_until >= c.now AS held,
       l.acquired_at, last.outcome AS last_outcome, last.finished_at AS last_at,
       last.token AS last_token, c.now,
       count(*) OVER () AS total
FROM {schema}.job_leases AS l
CROSS JOIN clock AS c
LEFT JOIN LATERAL (
    SELECT r.outcome, coalesce(r.finished_at, r.recorded_at) AS finished_at, r.token
    FROM {schema}.exec_runs AS r
    WHERE r.job_key = l.job_key
    ORDER BY r.run_id DESC
    LIMIT 1
) AS last ON true
WHERE NOT EXISTS (SELECT FROM {schema}.scheduled_jobs AS j WHERE j.job_key = l.job_key)
  AND (%(search)s::text IS NULL OR strpos(lower(l.job_key), lower(%(search)s::text)) > 0)
ORDER BY l.job_key
LIMIT %(limit)s;

-- name: ui_workers
-- Per worker: its presence row (scheduler_workers, migration 13: app, how many job keys its
-- code defines, alive while seen_until is ahead), the runs it recorded since %(since)s
-- (by recorded_at, as the overview's counts), the runs it has in
-- progress now (scheduled_jobs.running_token: at most one per job), and what its last
-- presence beat said of it (migration 17: the longest loop lag since the beat before,
-- whether it was saturated; NULL before its first beat or from an earlier version).
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), recent AS (
    SELECT worker_id, max(host) AS host, max(pid) AS pid, count(*) AS runs,
           count(*) FILTER (WHERE outcome = 'failed') AS failed,
           count(*) FILTER (WHERE outcome IN ('lease_lost', 'stale_rejected')) AS fenced,
           max(recorded_at) AS last_at
    FROM {schema}.job_runs
    WHERE recorded_at >= %(since)s
    GROUP BY worker_id
), running AS (
    SELECT r.worker_id, array_agg(r.job_key ORDER BY r.job_key) AS keys
    FROM {schema}.scheduled_jobs AS j
    JOIN {schema}.job_runs AS r ON r.job_key = j.job_key AND r.token = j.running_token
    WHERE j.running_slot IS NOT NULL AND r.outcome = 'running'
    GROUP BY r.worker_id
), ids AS (
    SELECT worker_id FROM {schema}.scheduler_workers
    UNION SELECT worker_id FROM recent
    UNION SELECT worker_id FROM running
)
SELECT i.worker_id AS worker, w.app, coalesce(w.host, rc.host) AS host,
       coalesce(w.pid, rc.pid) AS pid, w.seen_until,
       coalesce(w.seen_until >= c.now, false) AS alive,
       cardinality(w.job_keys) AS defines, coalesce(rc.runs, 0) AS runs,
       coalesce(rc.failed, 0) AS failed, coalesce(rc.fenced, 0) AS fenced, rc.last_at,
       coalesce(rn.keys, '{}') AS running, w.loop_lag, w.saturated, c.now
FROM ids AS i
CROSS JOIN clock AS c
LEFT JOIN {schema}.scheduler_workers AS w ON w.worker_id = i.worker_id
LEFT JOIN recent AS rc ON rc.worker_id = i.worker_id
LEFT JOIN running AS rn ON rn.worker_id = i.worker_id
ORDER BY coalesce(w.seen_until >= c.now, false) DESC, cardinality(rn.keys) DESC NULLS LAST,
         i.worker_id
LIMIT 200;

-- name: ui_throughput_job
-- The throughput and lateness charts of one job's page: per time slice of the shown window
-- (date_bin: %(stride)s wide from %(since)s, by recorded_at, which is a run's start) how many
-- runs started (a skipped slot's row has no start: left out), and the median and 99th
-- percentile of how late its scheduled runs started after their slots (seconds); plus one
-- row for the whole window (bin NULL: the empty grouping set). An index-only scan of
-- job_runs_window (job_key, recorded_at) INCLUDE (outcome, kind, slot), bounded by the
-- window; at most %(limit)s rows.
SELECT bin, count(*) AS runs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY late) FILTER (WHERE scheduled) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY late) FILTER (WHERE scheduled) AS p99
FROM (
    SELECT date_bin(%(stride)s::interval, recorded_at, %(since)s) AS bin,
           extract(epoch FROM recorded_at - slot)::float8 AS late,
           kind = 'scheduled' AS scheduled
    FROM {schema}.job_runs
    WHERE job_key = %(job_key)s AND recorded_at >= %(since)s AND recorded_at < %(until)s
      AND outcome <> 'misfire_skipped'
) AS r
GROUP BY GROUPING SETS ((bin), ())
ORDER BY bin NULLS FIRST
LIMIT %(limit)s;

-- name: ui_throughput_all
-- The same for every job together (the overview's charts), by job_runs_recorded: the
-- overview's window is short (15 minutes), so its rows are few whatever the history's size.
SELECT bin, count(*) AS runs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY late) FILTER (WHERE scheduled) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY late) FILTER (WHERE scheduled) AS p99
FROM (
    SELECT date_bin(%(stride)s::interval, recorded_at, %(since)s) AS bin,
           extract(epoch FROM recorded_at - slot)::float8 AS late,
           kind = 'scheduled' AS scheduled
    FROM {schema}.job_runs
    WHERE recorded_at >= %(since)s AND recorded_at < %(until)s
      AND outcome <> 'misfire_skipped'
) AS r
GROUP BY GROUPING SETS ((bin), ())
ORDER BY bin NULLS FIRST
LIMIT %(limit)s;
