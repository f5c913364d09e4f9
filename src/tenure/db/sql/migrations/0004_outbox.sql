-- tenure schema, version 4: the transactional outbox and the consumers' inbox.
-- {schema} is substituted as an identifier.

-- One row per message. A row exists only if the transaction that enqueued it committed
-- (the caller's own, fenced, transaction). (topic, key) is the business key: enqueuing it
-- twice keeps the first message. Rows are never updated back from 'delivered'.
CREATE TABLE {schema}.outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic           text        NOT NULL CHECK (length(topic) BETWEEN 1 AND 200),
    key             text        NOT NULL CHECK (length(key) BETWEEN 1 AND 500),
    payload         jsonb       NOT NULL,
    -- Messages sharing (topic, order_key) are delivered one at a time in id order.
    order_key       text        CHECK (length(order_key) BETWEEN 1 AND 500),
    -- Audit: the job and fencing token whose fenced transaction enqueued the message.
    job_key         text,
    token           bigint,
    state           text        NOT NULL DEFAULT 'pending'
                                CHECK (state IN ('pending', 'delivered', 'dead')),
    -- Claims counted so far (a claim that never reported back counts too).
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- Not claimable before this (database clock): retry backoff.
    available_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- A relay's claim (visibility timeout, database clock); expired claims are re-claimable.
    claimed_by      uuid,
    claimed_until   timestamptz,
    last_error      text,
    last_attempt_at timestamptz,
    delivered_at    timestamptz,
    delivered_by    uuid,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (topic, key),
    CHECK ((job_key IS NULL) = (token IS NULL))
);

-- The relays' claim scan: pending messages in id order.
CREATE INDEX outbox_pending ON {schema}.outbox (id) WHERE state = 'pending';
-- The per-key ordering check: an older undelivered message of the same (topic, order_key).
CREATE INDEX outbox_order ON {schema}.outbox (topic, order_key, id)
    WHERE order_key IS NOT NULL AND state <> 'delivered';

-- Consumers' record of applied messages: a row per (consumer, key), inserted in the
-- consumer's own transaction together with the side effect.
CREATE TABLE {schema}.inbox (
    consumer   text        NOT NULL CHECK (length(consumer) BETWEEN 1 AND 200),
    key        text        NOT NULL CHECK (length(key) BETWEEN 1 AND 1000),
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, key)
);
