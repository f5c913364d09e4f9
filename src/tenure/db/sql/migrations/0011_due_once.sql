-- tenure schema, version 11: a job that is claimed or running is not due until its worker
-- could be gone. {schema} is substituted as an identifier.
--
-- Before, a claimed job stayed due (at its slot) until its start was recorded, and a running
-- job was due at -infinity (so that a dead worker's slot is retried as soon as its lease
-- expires): every claim of every worker read each of them and probed its live lease, and a
-- run moved due_at twice. Now held_until, while set, is when the job is due again:
--   * the claim sets it to the end of the lease it took (claim + TTL): a worker that dies
--     before it records the start leaves the job to the next claim after that;
--   * the start sets it to the job's next slot or the start + TTL, whichever is first, for a
--     run (a dead worker's slot is retried once its lease has expired), and clears it when
--     there is nothing to run;
--   * the finish clears it: a done run is due at its next slot, where the start already put
--     it (that update moves no index entry, so it can be heap-only); a slot left to be
--     retried is due at once, as before.
-- A row claimed or running from before this version has no held_until and is due as before.
ALTER TABLE {schema}.scheduled_jobs ADD COLUMN held_until timestamptz;

-- PostgreSQL before 17 cannot change a generation expression: drop and add the column
-- (its index goes with it). Adding a stored generated column rewrites scheduled_jobs under an
-- exclusive lock: claims wait for it (a second or so for 100,000 jobs).
ALTER TABLE {schema}.scheduled_jobs DROP COLUMN due_at;
ALTER TABLE {schema}.scheduled_jobs ADD COLUMN due_at timestamptz GENERATED ALWAYS AS (
    CASE WHEN held_until IS NOT NULL THEN held_until
         WHEN running_slot IS NOT NULL OR trigger_at IS NOT NULL THEN '-infinity'::timestamptz
         ELSE next_slot END
) STORED;
CREATE INDEX scheduled_jobs_due ON {schema}.scheduled_jobs (due_at) WHERE NOT paused;

-- Room on each page for heap-only updates (each run updates its job row three times, and the
-- finish's moves no index entry): without it a full page sends the new version elsewhere,
-- and every index gets an entry.
ALTER TABLE {schema}.scheduled_jobs SET (fillfactor = 70);
