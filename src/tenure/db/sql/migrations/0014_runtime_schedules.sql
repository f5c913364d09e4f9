-- tenure schema, version 14: runtime schedules (issue 27). {schema} is substituted as an
-- identifier.
--
-- A runtime schedule is a scheduled_jobs row that no code deploy owns: it names a task (a
-- function an app registers with @app.task) and JSON arguments, and is added, changed and
-- removed while the fleet runs (tenure.add_schedule, `tenure schedules`). It is claimed,
-- started, fenced and finished by the same statements as a coded job; the claim reads its
-- definition (task, args, revision) and the start is refused when the revision has moved
-- since (a change commits at one instant: docs/schedules.md). A removed key's lease and
-- fence rows stay, so a key added again keeps its token floor.
ALTER TABLE {schema}.scheduled_jobs
    -- NULL: a coded job (@app.job). Else the task the schedule runs.
    ADD COLUMN task text CHECK (length(task) BETWEEN 1 AND 200),
    ADD COLUMN args jsonb,
    -- A one-shot schedule's instant (cron and every are NULL then).
    ADD COLUMN run_at timestamptz,
    -- No slot before starts_at nor after ends_at.
    ADD COLUMN starts_at timestamptz,
    ADD COLUMN ends_at timestamptz,
    -- Each slot is moved later by a stable offset in [0, jitter) derived from key and slot.
    ADD COLUMN jitter interval,
    -- After this many scheduled runs have started, no more slots.
    ADD COLUMN max_runs integer CHECK (max_runs >= 1),
    ADD COLUMN runs_started integer NOT NULL DEFAULT 0,
    -- A slot that came while the previous run held the lease: skipped, or run once after it
    -- (buffer_one). NULL (coded jobs): the misfire policy decides, as before.
    ADD COLUMN overlap text CHECK (overlap IN ('skip', 'buffer_one')),
    -- Why it was paused (an operator's note).
    ADD COLUMN pause_note text CHECK (length(pause_note) <= 1000),
    -- A backfill in progress: the next past slot to run (kind 'backfill') and the last one.
    ADD COLUMN backfill_next timestamptz,
    ADD COLUMN backfill_to timestamptz,
    ADD CONSTRAINT scheduled_jobs_runtime CHECK (
        task IS NOT NULL OR (args IS NULL AND run_at IS NULL AND overlap IS NULL)),
    ADD CONSTRAINT scheduled_jobs_window CHECK (ends_at IS NULL OR starts_at IS NULL
                                                 OR ends_at >= starts_at),
    ADD CONSTRAINT scheduled_jobs_args_size CHECK (args IS NULL OR octet_length(args::text) <= 65536);

ALTER TABLE {schema}.scheduled_jobs DROP CONSTRAINT scheduled_jobs_check;
ALTER TABLE {schema}.scheduled_jobs ADD CONSTRAINT scheduled_jobs_trigger
    CHECK (num_nonnulls(cron, every, run_at) = 1);

ALTER TABLE {schema}.scheduled_jobs DROP CONSTRAINT scheduled_jobs_running_kind_check;
ALTER TABLE {schema}.scheduled_jobs ADD CONSTRAINT scheduled_jobs_running_kind_check
    CHECK (running_kind IN ('scheduled', 'retry', 'manual', 'backfill'));
ALTER TABLE {schema}.job_runs DROP CONSTRAINT job_runs_kind_check;
ALTER TABLE {schema}.job_runs ADD CONSTRAINT job_runs_kind_check
    CHECK (kind IN ('scheduled', 'retry', 'manual', 'backfill'));

-- A pending backfill makes the job due at once, like a pending trigger. PostgreSQL before 17
-- cannot change a generation expression: drop and add (as migration 11 did).
ALTER TABLE {schema}.scheduled_jobs DROP COLUMN due_at;
ALTER TABLE {schema}.scheduled_jobs ADD COLUMN due_at timestamptz GENERATED ALWAYS AS (
    CASE WHEN held_until IS NOT NULL THEN held_until
         WHEN running_slot IS NOT NULL OR trigger_at IS NOT NULL OR backfill_next IS NOT NULL
         THEN '-infinity'::timestamptz
         ELSE next_slot END
) STORED;
CREATE INDEX scheduled_jobs_due ON {schema}.scheduled_jobs (due_at) WHERE NOT paused;
-- Listing and searching runtime schedules by key, a page at a time.
CREATE INDEX scheduled_jobs_tasks ON {schema}.scheduled_jobs (job_key) WHERE task IS NOT NULL;

-- The tasks each app's workers registered (at start): a schedule naming a task no worker of
-- its app has registered is refused when it is added.
CREATE TABLE {schema}.schedule_tasks (
    app           text        NOT NULL CHECK (length(app) BETWEEN 1 AND 500),
    task          text        NOT NULL CHECK (length(task) BETWEEN 1 AND 200),
    registered_at timestamptz NOT NULL,
    registered_by text        NOT NULL,
    PRIMARY KEY (app, task)
);
CREATE INDEX schedule_tasks_task ON {schema}.schedule_tasks (task);

-- Every change of a runtime schedule: who (role and application_name), when, before and
-- after (the definition as JSON; NULL before an add, NULL after a remove).
CREATE TABLE {schema}.schedule_changes (
    change_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_key          text        NOT NULL,
    action           text        NOT NULL CHECK (action IN (
        'add', 'replace', 'update', 'remove', 'pause', 'resume', 'backfill')),
    role             text        NOT NULL,
    application_name text        NOT NULL,
    changed_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    before           jsonb,
    after            jsonb
);
CREATE INDEX schedule_changes_key ON {schema}.schedule_changes (job_key, change_id);
