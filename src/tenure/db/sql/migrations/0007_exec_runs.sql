-- tenure schema, version 7: the run history of `tenure exec`, so that `tenure status` shows
-- exec runs (last run, outcome, counts, durations) as it shows the scheduler's.
-- {schema} is substituted as an identifier.

-- One row per command started under a lease: inserted as 'running' just before the command
-- starts, updated when it ends. A row left 'running' whose lease has expired or moved on is
-- a run whose tenure exec died (status shows it as abandoned). History, not a guarantee:
-- the fenced writes and exec_slots are what the safety argument rests on. Prune old rows
-- with a plain DELETE on recorded_at if they pile up.
CREATE TABLE {schema}.exec_runs (
    run_id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_key     text        NOT NULL,
    token       bigint      NOT NULL CHECK (token > 0),
    slot        text,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    outcome     text        NOT NULL CHECK (outcome IN (
        'running', 'succeeded', 'failed', 'lease_lost')),
    exit_code   integer,
    error       text,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- A token is one takeover: at most one run per (job, token).
CREATE UNIQUE INDEX exec_runs_run ON {schema}.exec_runs (job_key, token);
CREATE INDEX exec_runs_history ON {schema}.exec_runs (job_key, run_id);
CREATE INDEX exec_runs_recorded ON {schema}.exec_runs (recorded_at);
