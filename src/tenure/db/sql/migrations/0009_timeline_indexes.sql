-- tenure schema, version 9: indexes for the dashboard's timeline of a busy job.
-- {schema} is substituted as an identifier.

-- A dense window (a job with 100,000 runs in the last 7 days) is drawn as counts per time
-- slice and outcome, the worst lateness per slice, and its notable runs. Counting read every
-- run's heap row through job_runs_timeline (migration 6); with what the counts need in the
-- index (outcome; kind and slot for lateness: a run is recorded when it starts) they come
-- from an index-only scan. Same key columns, so it replaces job_runs_timeline for the
-- window's newest runs too.
CREATE INDEX job_runs_window ON {schema}.job_runs (job_key, recorded_at)
    INCLUDE (outcome, kind, slot);
DROP INDEX {schema}.job_runs_timeline;

-- The notable runs of a window (anything but a plain success on its first attempt: failures,
-- lost leases, refused writes, skips, takeovers' successors, unfinished runs), newest first,
-- without walking the successes in between. Small: a healthy job's runs leave it when they
-- succeed (the predicate must match the query's text in tenure/ui/sql/ui.sql).
CREATE INDEX job_runs_notable ON {schema}.job_runs (job_key, recorded_at)
    WHERE outcome <> 'succeeded' OR attempt > 1;
