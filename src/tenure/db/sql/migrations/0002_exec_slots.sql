-- tenure schema, version 2: schedule slots that `tenure exec --slot/--every` completed.
-- {schema} is substituted as an identifier.

-- One row per (job, slot) that ran to a successful end. A row is written only in a
-- transaction fenced by the run's token (strict fence on job_state), so a run whose lease
-- was lost cannot mark its slot done; a crashed or lost run writes nothing and the slot
-- can run again with a higher token. Rows are small and never needed again once the slot
-- is in the past: prune old ones with a plain DELETE on completed_at if they pile up.
CREATE TABLE {schema}.exec_slots (
    job_key      text        NOT NULL,
    slot         text        NOT NULL CHECK (length(slot) BETWEEN 1 AND 300),
    token        bigint      NOT NULL CHECK (token > 0),
    completed_at timestamptz NOT NULL,
    PRIMARY KEY (job_key, slot)
);
