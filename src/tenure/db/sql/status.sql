-- `tenure status`: one row per job key that has a lease or a schedule, read from the database
-- alone, so it shows what every process did: the scheduler's runs (job_runs) and `tenure
-- exec`'s (exec_runs) alike. Every time is the database clock.
-- {schema} is substituted as an identifier.

-- name: status_jobs
-- %(window)s: the period the counts and percentiles cover (runs whose history row was
-- recorded in it: a run's row is inserted when it starts; recorded_at is indexed).
-- Durations: runs that completed their body (succeeded or failed); a run cut short by a
-- lost lease or a shutdown would understate them. percentile_cont interpolates linearly.
WITH clock AS (
    SELECT clock_timestamp() AS now
), keys AS (
    SELECT job_key FROM {schema}.job_leases
    UNION
    SELECT job_key FROM {schema}.scheduled_jobs
), runs AS (
    SELECT r.job_key, r.outcome, r.started_at, r.finished_at
    FROM {schema}.job_runs AS r, clock AS c
    WHERE r.recorded_at >= c.now - %(window)s::interval
      AND r.started_at IS NOT NULL
    UNION ALL
    SELECT e.job_key, e.outcome, e.started_at, e.finished_at
    FROM {schema}.exec_runs AS e, clock AS c
    WHERE e.recorded_at >= c.now - %(window)s::interval
), recent AS (
    SELECT r.job_key,
           count(*) AS runs,
           count(*) FILTER (WHERE r.outcome = 'failed') AS failures,
           count(*) FILTER (WHERE r.outcome = 'lease_lost') AS lost_leases,
           count(*) FILTER (WHERE r.outcome = 'stale_rejected') AS stale_rejections,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]::float8[]) WITHIN GROUP (
               ORDER BY extract(epoch FROM r.finished_at - r.started_at)::float8
           ) FILTER (WHERE r.outcome IN ('succeeded', 'failed') AND r.finished_at IS NOT NULL)
               AS durations
    FROM runs AS r
    GROUP BY r.job_key
)
SELECT k.job_key,
       l.fencing_token,
       l.lease_owner,
       l.lease_until,
       coalesce(l.lease_until >= c.now, false) AS held,
       extract(epoch FROM l.lease_until - c.now)::float8 AS seconds_left,
       j.job_key IS NOT NULL AS scheduled,
       j.paused,
       j.next_slot,
       last.slot,
       last.exec_slot,
       last.kind,
       last.token,
       last.outcome,
       last.started_at,
       last.finished_at,
       last.error,
       last.exit_code,
       coalesce(w.runs, 0) AS runs,
       coalesce(w.failures, 0) AS failures,
       coalesce(w.lost_leases, 0) AS lost_leases,
       coalesce(w.stale_rejections, 0) AS stale_rejections,
       w.durations,
       res.applied_fencing_token,
       res.written_at,
       c.now,
       j.quarantine_reason
FROM keys AS k
CROSS JOIN clock AS c
LEFT JOIN {schema}.job_leases AS l ON l.job_key = k.job_key
LEFT JOIN {schema}.scheduled_jobs AS j ON j.job_key = k.job_key
LEFT JOIN {schema}.report_results AS res ON res.job_key = k.job_key
LEFT JOIN recent AS w ON w.job_key = k.job_key
-- The newest run: the scheduler's newest or exec's newest, whichever started last. An exec
-- run still 'running' whose lease expired or moved on lost its tenure exec: abandoned.
-- Newest = highest token (each run is one takeover, and tokens only go up), read through
-- the (job_key, token) unique indexes: ordered by run_id, the planner walked the primary
-- key backwards filtering on the key, the whole table for every job without such runs
-- (seconds once the history is at its retention size).
LEFT JOIN LATERAL (
    SELECT * FROM (
        (SELECT r.slot, NULL::text AS exec_slot, r.kind, r.token, r.outcome, r.started_at,
                r.finished_at, r.error, NULL::integer AS exit_code
         FROM {schema}.job_runs AS r
         WHERE r.job_key = k.job_key AND r.started_at IS NOT NULL
         ORDER BY r.token DESC
         LIMIT 1)
        UNION ALL
        (SELECT NULL::timestamptz, e.slot, 'exec', e.token,
                CASE WHEN e.outcome = 'running'
                      AND NOT (l.fencing_token = e.token AND l.lease_until >= c.now)
                     THEN 'abandoned' ELSE e.outcome END,
                e.started_at, e.finished_at, e.error, e.exit_code
         FROM {schema}.exec_runs AS e
         WHERE e.job_key = k.job_key
         ORDER BY e.token DESC
         LIMIT 1)
    ) AS newest
    ORDER BY newest.started_at DESC
    LIMIT 1
) AS last ON true
ORDER BY k.job_key;
