-- tenure schema, version 8: which topics the live outbox relays handle.
-- {schema} is substituted as an identifier.

-- One row per running relay, written when it starts and renewed while it runs (a heartbeat
-- pushes seen_until forward); a relay that stops deletes its row, one that dies leaves a row
-- that is ignored once seen_until has passed. It answers "is any relay handling topic X?":
-- a pending message whose topic no live relay lists waits for one, and is reported.
CREATE TABLE {schema}.outbox_relays (
    relay_id   uuid        PRIMARY KEY,
    topics     text[]      NOT NULL,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    seen_until timestamptz NOT NULL
);

