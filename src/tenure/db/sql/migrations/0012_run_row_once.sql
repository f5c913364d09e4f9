-- tenure schema, version 12: a scheduled run's history row is written once, at its end,
-- instead of inserted at its start and updated at its end. {schema} is substituted as an
-- identifier.
--
-- The finishing UPDATE of job_runs was never heap-only (outcome is in job_runs_window and in
-- job_runs_notable's predicate), so a run wrote an entry in each of job_runs' six indexes
-- twice, and the insert made the start statement, the one on a run's lateness path, twice as
-- long (bench/README.md, "Fourth pass"). Now:
--   * the start records the run on its job row only: running_slot, running_token, ... as
--     before, and the columns below (who runs it, since when);
--   * the finish inserts the history row (or completes one that is already there);
--   * a run still going after a second gets its 'running' row from its worker
--     (sched_running), so history and the dashboard show runs in progress as before;
--   * a run whose worker is gone is recorded from its job row by the next start.
-- Workers of earlier versions and of this one must not run the same app side by side: each
-- records a run the other started in its own way (a run taken over across versions may be
-- left without its history row). Stop the old workers, migrate, start the new ones.
ALTER TABLE {schema}.scheduled_jobs
    ADD COLUMN running_owner uuid,
    ADD COLUMN running_started_at timestamptz,
    ADD COLUMN running_worker text,
    ADD COLUMN running_host text,
    ADD COLUMN running_pid integer;
