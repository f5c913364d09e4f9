-- Named queries of the transactional outbox, its relays and the consumers' inbox (see
-- src/tenure/relay.py for the delivery protocol). {schema} is substituted as an identifier.
-- A message's columns, in the order tenure.outbox.Message takes them:
--   id, topic, key, payload, order_key, job_key, token, state, attempts, created_at,
--   available_at, last_error, last_attempt_at, delivered_at, claimed_until, traceparent

-- name: outbox_enqueue
-- Runs in the caller's transaction: the row and the notification exist only if it commits
-- (PostgreSQL delivers NOTIFY at commit, and drops it on rollback). The notification is
-- sent only for a new message.
WITH ins AS (
    INSERT INTO {schema}.outbox (topic, key, payload, order_key, job_key, token, traceparent)
    VALUES (%(topic)s, %(key)s, %(payload)s, %(order_key)s, %(job_key)s, %(token)s,
            %(traceparent)s)
    ON CONFLICT (topic, key) DO NOTHING
    RETURNING id, topic
), notified AS (
    SELECT pg_notify(%(channel)s, topic) FROM ins
)
SELECT (SELECT id FROM ins) AS id, (SELECT count(*) FROM notified) AS notified;

-- name: outbox_claim
-- A relay claims up to `limit` deliverable messages for `visibility` (database clock), of the
-- topics it has handlers for only: a message of another topic stays for a relay that has one.
-- SKIP LOCKED: relays claiming at the same moment take different rows. A row claimed by a
-- concurrent relay that committed after our snapshot is re-checked on its new version
-- (EvalPlanQual), finds a live claim and is skipped. Per-key ordering: a message is not
-- claimable while an older message of the same (topic, order_key) is undelivered (pending,
-- claimed or dead), so one key has at most one message in flight.
WITH picked AS (
    SELECT o.id
    FROM {schema}.outbox AS o
    WHERE o.state = 'pending'
      AND o.available_at <= clock_timestamp()
      AND (o.claimed_until IS NULL OR o.claimed_until < clock_timestamp())
      AND o.topic = ANY (%(topics)s::text[])
      AND (o.order_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {schema}.outbox AS p
            WHERE p.topic = o.topic AND p.order_key = o.order_key
              AND p.id < o.id AND p.state <> 'delivered'))
    ORDER BY o.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox AS o
SET claimed_by = %(relay)s,
    claimed_until = clock_timestamp() + %(visibility)s,
    attempts = o.attempts + 1,
    last_attempt_at = clock_timestamp()
FROM picked
WHERE o.id = picked.id
RETURNING o.id, o.topic, o.key, o.payload, o.order_key, o.job_key, o.token, o.state,
          o.attempts, o.created_at, o.available_at, o.last_error, o.last_attempt_at,
          o.delivered_at, o.claimed_until, o.traceparent;

-- name: outbox_delivered
-- Recorded only after the handler succeeded, and only by the claim that delivered (relay and
-- attempt number): a relay whose claim was taken over records nothing, the new claimant
-- delivers again (at least once). Delivering a message with an order key may make the next
-- one of that key claimable: tell the relays. The error of an earlier attempt is cleared: a
-- delivered message has none.
WITH done AS (
    UPDATE {schema}.outbox
    SET state = 'delivered', delivered_at = clock_timestamp(), delivered_by = %(relay)s,
        claimed_by = NULL, claimed_until = NULL, last_error = NULL
    WHERE id = %(id)s AND claimed_by = %(relay)s AND attempts = %(attempt)s
      AND state = 'pending'
    RETURNING topic, order_key
), notified AS (
    SELECT pg_notify(%(channel)s, topic) FROM done WHERE order_key IS NOT NULL
)
SELECT (SELECT count(*) FROM done) AS recorded, (SELECT count(*) FROM notified) AS notified;

-- name: outbox_failed
-- A failed attempt: back off (the delay is computed by the relay, added to the database
-- clock), or park the message as dead. Same claim check as outbox_delivered.
UPDATE {schema}.outbox
SET state = CASE WHEN %(dead)s::boolean THEN 'dead' ELSE 'pending' END,
    last_error = %(error)s,
    available_at = clock_timestamp() + %(delay)s,
    claimed_by = NULL,
    claimed_until = NULL
WHERE id = %(id)s AND claimed_by = %(relay)s AND attempts = %(attempt)s AND state = 'pending'
RETURNING state, available_at;

-- name: outbox_release
-- Give a claim back without counting the attempt (the relay is stopping, or its claim ran
-- out before the handler could start).
UPDATE {schema}.outbox
SET claimed_by = NULL, claimed_until = NULL, attempts = attempts - 1
WHERE id = %(id)s AND claimed_by = %(relay)s AND attempts = %(attempt)s AND state = 'pending'
RETURNING id;

-- name: outbox_next_due
-- Seconds until the earliest pending message becomes claimable (backoff or a claim running
-- out), NULL if none is waiting: how long a relay may sleep without a notification.
SELECT extract(epoch FROM min(greatest(available_at, coalesce(claimed_until, available_at)))
                          - clock_timestamp())::float8
FROM {schema}.outbox
WHERE state = 'pending'
  AND greatest(available_at, coalesce(claimed_until, available_at)) > clock_timestamp()
  AND topic = ANY (%(topics)s::text[]);

-- name: outbox_relay_beat
-- A relay says it is alive and which topics it handles, until `ttl` from now (database
-- clock); the first beat registers it. Rows of relays that died long ago are removed here,
-- so the table stays as small as the fleet.
WITH gone AS (
    DELETE FROM {schema}.outbox_relays
    WHERE seen_until < clock_timestamp() - interval '1 day' AND relay_id <> %(relay)s
)
INSERT INTO {schema}.outbox_relays (relay_id, topics, host, pid, seen_until)
VALUES (%(relay)s, %(topics)s, %(host)s, %(pid)s, clock_timestamp() + %(ttl)s)
ON CONFLICT (relay_id) DO UPDATE
SET topics = excluded.topics, seen_until = excluded.seen_until
RETURNING seen_until;

-- name: outbox_relay_leave
-- A relay that stops takes its topics off the list at once.
DELETE FROM {schema}.outbox_relays WHERE relay_id = %(relay)s;

-- name: outbox_unhandled
-- Per topic, the pending messages that no live relay handles (none lists the topic, or the
-- relays that do stopped beating): how many, and the age of the oldest (database clock).
SELECT o.topic, count(*) AS pending,
       extract(epoch FROM clock_timestamp() - min(o.created_at))::float8 AS oldest_age
FROM {schema}.outbox AS o
WHERE o.state = 'pending'
  AND NOT EXISTS (
        SELECT 1 FROM {schema}.outbox_relays AS r
        WHERE r.seen_until >= clock_timestamp() AND o.topic = ANY (r.topics))
GROUP BY o.topic
ORDER BY o.topic;

-- name: outbox_list
SELECT id, topic, key, payload, order_key, job_key, token, state, attempts, created_at,
       available_at, last_error, last_attempt_at, delivered_at, claimed_until, traceparent
FROM {schema}.outbox
WHERE state = ANY (%(states)s::text[])
  AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY (%(ids)s::bigint[]))
ORDER BY id
LIMIT %(limit)s;

-- name: outbox_counts
SELECT state, count(*) FROM {schema}.outbox GROUP BY state;

-- name: outbox_retry
-- Operator re-drive: dead messages become pending with a fresh attempt budget, now. The
-- last error stays for the record until the next attempt overwrites it.
WITH redriven AS (
    UPDATE {schema}.outbox
    SET state = 'pending', attempts = 0, available_at = clock_timestamp(),
        claimed_by = NULL, claimed_until = NULL
    WHERE state = 'dead'
      AND (%(ids)s::bigint[] IS NULL OR id = ANY (%(ids)s::bigint[]))
      AND (%(topic)s::text IS NULL OR topic = %(topic)s)
    RETURNING id
), notified AS (
    SELECT pg_notify(%(channel)s, 'retry') WHERE EXISTS (SELECT 1 FROM redriven)
)
SELECT coalesce((SELECT array_agg(id ORDER BY id) FROM redriven), '{}'::bigint[]) AS ids,
       (SELECT count(*) FROM notified) AS notified;

-- name: outbox_purge
-- Delete delivered or dead messages whose last event is older than `older_than` (database
-- clock). Pending messages are never purged: that would lose them.
WITH gone AS (
    DELETE FROM {schema}.outbox
    WHERE state = %(state)s
      AND coalesce(delivered_at, last_attempt_at, created_at) <= clock_timestamp() - %(older_than)s
      AND (%(ids)s::bigint[] IS NULL OR id = ANY (%(ids)s::bigint[]))
      AND (%(topic)s::text IS NULL OR topic = %(topic)s)
    RETURNING id
)
SELECT count(*) FROM gone;

-- name: inbox_claim
-- In the consumer's transaction. A concurrent claim of the same key waits for this
-- transaction: if it commits, the other finds the row and returns nothing (already applied);
-- if it rolls back, the other inserts.
INSERT INTO {schema}.inbox (consumer, key)
VALUES (%(consumer)s, %(key)s)
ON CONFLICT (consumer, key) DO NOTHING
RETURNING applied_at;

-- name: outbox_extend
-- A relay keeps its claim while a synchronous handler (a thread, which cannot be
-- interrupted) runs past its timeout: no other attempt may start meanwhile. Same claim check
-- as outbox_delivered; no row means the claim was lost (taken over after it ran out).
UPDATE {schema}.outbox
SET claimed_until = clock_timestamp() + %(visibility)s
WHERE id = %(id)s AND claimed_by = %(relay)s AND attempts = %(attempt)s AND state = 'pending'
RETURNING claimed_until;
