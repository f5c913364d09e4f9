-- tenure schema, version 13 (issue 31): a run of skipped slots is one history row, and the
-- live scheduler workers say which job keys they define. {schema} is substituted as an
-- identifier.

-- How many consecutive slots a history row stands for: 1 for a run (and for a single
-- skipped slot); a misfire_skipped row records every slot from slot to last_slot (an hour
-- of an every-1s job's downtime was 3,600 rows, a week would be 600,000). Adding a column
-- with a constant default rewrites nothing; the constraint is NOT VALID so that migrating a
-- large history does not scan it under the table's lock (every existing row has 1 and NULL).
ALTER TABLE {schema}.job_runs
    ADD COLUMN slots integer NOT NULL DEFAULT 1,
    ADD COLUMN last_slot timestamptz;
ALTER TABLE {schema}.job_runs ADD CONSTRAINT job_runs_slots
    CHECK (slots >= 1 AND (slots = 1) = (last_slot IS NULL) AND last_slot > slot) NOT VALID;

-- One row per running scheduler worker: its app and the job keys its code defines, written
-- when it starts, its seen_until pushed forward while it runs (every PRESENCE_EVERY, see
-- scheduler/presence.py); a worker that stops deletes its row, one that dies leaves a row
-- that is ignored once seen_until has passed. It answers "does any live worker define job
-- X?": a job of an app whose live workers all lack it (removed from the code) is shown as
-- "no worker defines it", its dead run is recorded as lost, and `tenure jobs remove` may
-- delete its definition (its lease row, and so its token floor, stays).
CREATE TABLE {schema}.scheduler_workers (
    worker_id  text        PRIMARY KEY,
    app        text        NOT NULL,
    job_keys   text[]      NOT NULL,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    seen_until timestamptz NOT NULL
);
CREATE INDEX scheduler_workers_app ON {schema}.scheduler_workers (app, seen_until);
