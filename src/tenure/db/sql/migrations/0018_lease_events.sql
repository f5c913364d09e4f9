-- tenure schema, version 18 (issue 29): a bounded record of what happened to a lease, for
-- keys with no run history of their own (bare library leases, `tenure demo`, `@tenure.once`):
-- each takeover (an acquire that got a token) and each write the fence refused. The
-- dashboard draws them on the key's timeline. {schema} is substituted as an identifier.
--
-- Written by `acquire` (a takeover, in the same statement), by `result_put` and
-- `result_put_strict` (a refused write, in the same statement, when nothing was written and
-- the token had been issued) and by `lease_event_refused` (fence() refused: a separate
-- autocommit statement from the client's pool, on the refusal path only, since the caller's
-- transaction rolls back). The scheduler's claims do not write here: its runs have their
-- history in job_runs. Nothing reads it to decide anything: it is history, pruned by age
-- like job_runs (retention_lease_events, docs/retention.md).
CREATE TABLE {schema}.lease_events (
    job_key text NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    token bigint NOT NULL,
    event text NOT NULL CHECK (event IN ('acquired', 'refused')),
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- What was refused ('results.put', 'results.put strict', 'fence'); NULL for a takeover.
    detail text,
    PRIMARY KEY (job_key, id)
);
-- Retention's batches, oldest first.
CREATE INDEX lease_events_at ON {schema}.lease_events (at);
