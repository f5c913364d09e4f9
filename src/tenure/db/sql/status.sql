-- `tenure status`: one row per job key that has a lease or a schedule, read from the database
-- alone, so it shows what every process did. Every time is the database clock.
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
    FROM {schema}.job_runs AS r, clock AS c
    WHERE r.recorded_at >= c.now - %(window)s::interval
      AND r.started_at IS NOT NULL
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
       last.kind,
       last.token,
       last.outcome,
       last.started_at,
       last.finished_at,
       last.error,
       coalesce(w.runs, 0),
       coalesce(w.failures, 0),
       coalesce(w.lost_leases, 0),
       coalesce(w.stale_rejections, 0),
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
LEFT JOIN LATERAL (
    SELECT r.slot, r.kind, r.token, r.outcome, r.started_at, r.finished_at, r.error
    FROM {schema}.job_runs AS r
    WHERE r.job_key = k.job_key AND r.started_at IS NOT NULL
    ORDER BY r.run_id DESC
    LIMIT 1
) AS last ON true
ORDER BY k.job_key;
