-- tenure schema, version 1: the seed's lease and result tables, plus the job-state row
-- that binds multi-table fenced transactions. {schema} is substituted as an identifier.

-- One row per job key, never deleted: fencing_token only ever goes up.
CREATE TABLE {schema}.job_leases (
    job_key       text        PRIMARY KEY CHECK (length(job_key) BETWEEN 1 AND 200),
    lease_owner   uuid        NOT NULL,
    lease_until   timestamptz NOT NULL,
    fencing_token bigint      NOT NULL CHECK (fencing_token > 0),
    lease_ttl     interval    NOT NULL,
    acquired_at   timestamptz NOT NULL,
    renewed_at    timestamptz NOT NULL
);

-- The fence row. `token` mirrors the newest committed takeover (written by acquire in the
-- same statement); a fenced transaction updates this row, so a takeover waits for it and a
-- predecessor's fence fails once the takeover has committed. Renewals never touch it.
CREATE TABLE {schema}.job_state (
    job_key      text        PRIMARY KEY,
    token        bigint      NOT NULL,
    fenced_token bigint,
    fenced_at    timestamptz
);

-- The seed's result store: last accepted token per key.
CREATE TABLE {schema}.report_results (
    job_key               text        PRIMARY KEY,
    payload               jsonb       NOT NULL,
    applied_fencing_token bigint      NOT NULL,
    written_at            timestamptz NOT NULL
);
