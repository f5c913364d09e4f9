-- tenure schema, version 11: a run moves its job's due_at once, not twice. {schema} is
-- substituted as an identifier.
--
-- Before, a running job was due at -infinity (so that a dead worker's slot is retried as
-- soon as its lease expires) and went back to its next slot when the run finished: two
-- non-HOT updates of scheduled_jobs per run, two new entries in scheduled_jobs_due, and
-- every claim walked every running job (each with a live lease) before the due ones. Now a
-- running job is due at its next slot or at running_due (the start plus the TTL: when a dead
-- worker's lease has expired), whichever comes first. The start moves due_at once; a finish
-- that clears running_slot leaves it where it is (the next slot), so that update can be
-- heap-only. A finish that leaves the slot to be retried sets running_due to -infinity:
-- retried at once, as before. A row still running from before this version has no
-- running_due and stays due at -infinity.
ALTER TABLE {schema}.scheduled_jobs ADD COLUMN running_due timestamptz;

-- PostgreSQL before 17 cannot change a generation expression: drop and add the column
-- (its index goes with it).
ALTER TABLE {schema}.scheduled_jobs DROP COLUMN due_at;
ALTER TABLE {schema}.scheduled_jobs ADD COLUMN due_at timestamptz GENERATED ALWAYS AS (
    CASE WHEN trigger_at IS NOT NULL THEN '-infinity'::timestamptz
         WHEN running_slot IS NOT NULL
         THEN least(next_slot, coalesce(running_due, '-infinity'::timestamptz))
         ELSE next_slot END
) STORED;
CREATE INDEX scheduled_jobs_due ON {schema}.scheduled_jobs (due_at) WHERE NOT paused;

-- Room on each page for the claim's and the finish's heap-only updates (each run updates
-- its job row three times): without it a full page sends the new version elsewhere, and
-- every index gets an entry.
ALTER TABLE {schema}.scheduled_jobs SET (fillfactor = 70);
