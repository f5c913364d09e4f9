-- tenure schema, version 3: the scheduler (tenure.Scheduler, `tenure worker`, `tenure jobs`).
-- A scheduled job runs while holding its key's lease in job_leases: every claim takes the
-- lease over with token + 1, exactly like acquire. {schema} is substituted as an identifier.

-- One row per job key: its definition (the newest registration wins) and its schedule state.
-- Every slot time is an absolute instant decided against the database clock.
CREATE TABLE {schema}.scheduled_jobs (
    job_key         text        PRIMARY KEY CHECK (length(job_key) BETWEEN 1 AND 200),
    cron            text,
    every           interval,
    timezone        text        NOT NULL,
    ttl             interval    NOT NULL,
    misfire         text        NOT NULL CHECK (misfire IN ('latest', 'all', 'skip')),
    misfire_grace   interval,
    on_crash        text        NOT NULL CHECK (on_crash IN ('retry', 'skip')),
    -- Bumped on every changed registration; a claim planned against an older revision does
    -- not move next_slot (the newer definition already set it).
    revision        integer     NOT NULL DEFAULT 1,
    defined_at      timestamptz NOT NULL,
    defined_by      text        NOT NULL,
    paused          boolean     NOT NULL DEFAULT false,
    paused_at       timestamptz,
    -- The oldest slot not yet claimed. Only ever moves forward (greatest()) for a revision.
    next_slot       timestamptz NOT NULL,
    -- The newest slot that finished or was skipped: such a slot is never claimed again.
    done_slot       timestamptz,
    -- Token of the newest claim: start and finish statements are fenced on it.
    claim_token     bigint,
    claimed_at      timestamptz,
    -- The slot being run (kept until its run finishes, so a dead holder's slot is retried).
    running_slot    timestamptz,
    running_kind    text        CHECK (running_kind IN ('scheduled', 'retry', 'manual')),
    running_token   bigint,
    running_attempt integer,
    -- A pending `tenure jobs trigger` (run now, once).
    trigger_at      timestamptz,
    -- When the row may next be claimed: its next slot, or at once when a run is pending or
    -- was left unfinished (a live lease still blocks the claim). Indexed, so a claim reads
    -- only the due rows, however many jobs there are.
    due_at          timestamptz GENERATED ALWAYS AS (
        CASE WHEN running_slot IS NOT NULL OR trigger_at IS NOT NULL
             THEN '-infinity'::timestamptz ELSE next_slot END
    ) STORED,
    CHECK ((cron IS NULL) <> (every IS NULL))
);
CREATE INDEX scheduled_jobs_due ON {schema}.scheduled_jobs (due_at) WHERE NOT paused;

-- Run history: one row per run (started_at set) and one per slot skipped without running
-- (misfire_skipped, abandoned; started_at null). Pruned by workers after the retention.
CREATE TABLE {schema}.job_runs (
    run_id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_key     text        NOT NULL,
    slot        timestamptz NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('scheduled', 'retry', 'manual')),
    attempt     integer     NOT NULL DEFAULT 1,
    token       bigint      NOT NULL,
    owner       uuid,
    worker_id   text        NOT NULL,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz,
    finished_at timestamptz,
    outcome     text        NOT NULL CHECK (outcome IN (
        'running', 'succeeded', 'failed', 'lease_lost', 'stale_rejected', 'cancelled',
        'abandoned', 'misfire_skipped')),
    error       text,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- A token is one claim: at most one run per (job, token).
CREATE UNIQUE INDEX job_runs_run ON {schema}.job_runs (job_key, token) WHERE started_at IS NOT NULL;
CREATE INDEX job_runs_history ON {schema}.job_runs (job_key, run_id);
CREATE INDEX job_runs_recorded ON {schema}.job_runs (recorded_at);
