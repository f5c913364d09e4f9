-- Named queries: each block starts with "-- name: NAME" and runs as ONE statement (one round
-- trip). {schema} is substituted once per client with psycopg.sql.Identifier; parameters are
-- psycopg named placeholders. See docs/safety.md for why each statement is safe.

-- fragment: token_floor
-- The first token of a key, and the least token of any takeover: (timeline - 1) * 2^40 + 1.
-- On timeline 1 that is 1 and changes nothing; after a failover to a replica (a new
-- timeline) every token is above all tokens the old primary could have issued, even
-- takeovers that asynchronous replication lost: a token is never reissued.
((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int - 1)
    ::bigint << 40) + 1

-- fragment: takeover
-- The upsert of a lease row (alias l) into job_leases: a new key's row goes in as inserted;
-- an existing row is taken over only if its lease has expired (evaluated again on the
-- locked row, so a concurrent renew or takeover wins cleanly), with the next token (at
-- least the floor). Used by acquire and sched_claim.
ON CONFLICT (job_key) DO UPDATE
SET lease_owner = excluded.lease_owner,
    lease_until = clock_timestamp() + excluded.lease_ttl,
    fencing_token = greatest(l.fencing_token + 1, excluded.fencing_token),
    lease_ttl = excluded.lease_ttl,
    acquired_at = clock_timestamp(),
    renewed_at = clock_timestamp()
WHERE l.lease_until < clock_timestamp()

-- name: acquire
-- A read-only look first: a live lease answers "busy" without a write or a row lock. Only
-- when the lease looks free or expired do we run the seed's upsert, whose WHERE is evaluated
-- again on the locked row, so a concurrent renew or takeover wins cleanly. The same statement
-- moves the fence row to the new token: it waits for any fenced transaction of the previous
-- holder (strict fencing), bounded by lock_timeout, which this statement lowers to at most
-- the TTL before it can wait (set_config(..., true) lasts until the statement ends).
-- The token floor and the takeover are the fragments below, shared with sched_claim.
WITH cur AS MATERIALIZED (
    SELECT fencing_token, lease_until, lease_until >= clock_timestamp() AS live
    FROM {schema}.job_leases
    WHERE job_key = %(job_key)s
), taken AS (
    INSERT INTO {schema}.job_leases AS l
        (job_key, lease_owner, lease_until, fencing_token, lease_ttl, acquired_at, renewed_at)
    SELECT %(job_key)s, %(owner)s, clock_timestamp() + %(ttl)s,
           {token_floor},
           %(ttl)s, clock_timestamp(), clock_timestamp()
    WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.live)
      AND (SELECT set_config('lock_timeout', %(lock_timeout)s, true)) IS NOT NULL
    {takeover}
    RETURNING l.job_key, l.fencing_token, l.lease_until, l.acquired_at
), state AS (
    INSERT INTO {schema}.job_state AS s (job_key, token)
    SELECT job_key, fencing_token FROM taken
    ON CONFLICT (job_key) DO UPDATE SET token = excluded.token
), event AS (
    -- The takeover's record (migration 18), for the key's timeline: one row, only when a
    -- token was issued (a busy answer writes nothing). History only: nothing reads it to
    -- decide; retention prunes it by age. The scheduler's claims do not write it.
    INSERT INTO {schema}.lease_events (job_key, token, event)
    SELECT job_key, fencing_token, 'acquired' FROM taken
)
SELECT true AS acquired, t.fencing_token, t.lease_until, t.acquired_at, clock_timestamp() AS now
FROM taken AS t
UNION ALL
SELECT false, c.fencing_token, c.lease_until, NULL, clock_timestamp()
FROM cur AS c
WHERE NOT EXISTS (SELECT 1 FROM taken);

-- name: renew
-- Lock first, then test expiry with a clock read taken AFTER the lock was granted. A plain
-- UPDATE would evaluate clock_timestamp() before waiting for a lock, and PostgreSQL does not
-- re-check the WHERE clause when the row was only locked (not updated) by the other
-- transaction: a renewal that waited could revive a lease that expired while it waited.
-- Its lock wait is bounded by a third of the TTL: a renewal that waits longer is useless.
WITH locked AS MATERIALIZED (
    SELECT job_key, lease_until
    FROM {schema}.job_leases
    WHERE job_key = %(job_key)s AND lease_owner = %(owner)s AND fencing_token = %(token)s
      AND (SELECT set_config('lock_timeout', %(lock_timeout)s, true)) IS NOT NULL
    FOR NO KEY UPDATE
)
UPDATE {schema}.job_leases AS l
SET lease_until = clock_timestamp() + %(ttl)s,
    lease_ttl = %(ttl)s,
    renewed_at = clock_timestamp()
FROM locked
WHERE l.job_key = locked.job_key
  AND locked.lease_until >= clock_timestamp()
RETURNING l.lease_until;

-- name: release
-- Expire our own lease now (an immediate takeover is possible); the row and token stay.
-- Waiters (client.lease(wait=...), tenure exec --wait) LISTEN on the schema's lease channel:
-- the notification, sent at commit and only when a lease was released, wakes them at once.
WITH released AS (
    UPDATE {schema}.job_leases
    SET lease_until = clock_timestamp()
    WHERE job_key = %(job_key)s AND lease_owner = %(owner)s AND fencing_token = %(token)s
      AND lease_until >= clock_timestamp()
    RETURNING fencing_token, lease_until
)
SELECT fencing_token, lease_until, pg_notify(%(channel)s, %(job_key)s)
FROM released;

-- name: force_release
-- Operator action: expire whatever lease is live on the key. The holder's writes stay fenced.
WITH released AS (
    UPDATE {schema}.job_leases
    SET lease_until = clock_timestamp()
    WHERE job_key = %(job_key)s AND lease_until >= clock_timestamp()
    RETURNING fencing_token, lease_owner
)
SELECT fencing_token, lease_owner, pg_notify(%(channel)s, %(job_key)s)
FROM released;

-- name: inspect
SELECT job_key, lease_owner, fencing_token, lease_until, lease_ttl, acquired_at, renewed_at,
       clock_timestamp() AS now
FROM {schema}.job_leases
WHERE job_key = %(job_key)s;

-- name: leases
SELECT job_key, lease_owner, fencing_token, lease_until, lease_ttl, acquired_at, renewed_at,
       clock_timestamp() AS now
FROM {schema}.job_leases
ORDER BY job_key;

-- name: fence
-- Strict fence, inside the caller's transaction: update the job-state row only while our
-- token is the newest takeover and our lease is unexpired. The row lock is held until the
-- caller commits, so a successor's takeover (which updates this row) waits for us, and once
-- a takeover has committed this UPDATE matches nothing. The transaction-local
-- idle_in_transaction_session_timeout lets the server end a paused holder's transaction so
-- it cannot block takeovers forever.
WITH fenced AS (
    UPDATE {schema}.job_state AS s
    SET fenced_token = s.token, fenced_at = clock_timestamp()
    FROM {schema}.job_leases AS l
    WHERE s.job_key = %(job_key)s AND s.token = %(token)s
      AND l.job_key = s.job_key AND l.fencing_token = s.token
      AND l.lease_until >= clock_timestamp()
    RETURNING s.token, l.lease_ttl
), idle AS (
    SELECT set_config('idle_in_transaction_session_timeout',
                      (ceil(extract(epoch FROM coalesce(%(idle)s::interval, f.lease_ttl)) * 1000))::bigint::text,
                      true)
    FROM fenced AS f
    WHERE %(set_idle)s::boolean
)
SELECT (SELECT token FROM fenced) AS fenced,
       (SELECT count(*) FROM idle) AS idle_set,
       (SELECT fencing_token FROM {schema}.job_leases WHERE job_key = %(job_key)s) AS current;

-- name: fence_relaxed
-- Fence for data in a database without the lease table: the seed's rule, last accepted token.
WITH fenced AS (
    INSERT INTO {schema}.job_state AS s (job_key, token, fenced_token, fenced_at)
    VALUES (%(job_key)s, %(token)s, %(token)s, clock_timestamp())
    ON CONFLICT (job_key) DO UPDATE
    SET token = greatest(s.token, excluded.token),
        fenced_token = excluded.fenced_token,
        fenced_at = excluded.fenced_at
    WHERE s.fenced_token IS NULL OR s.fenced_token <= excluded.fenced_token
    RETURNING s.fenced_token
)
SELECT (SELECT fenced_token FROM fenced) AS fenced,
       0::bigint AS idle_set,
       (SELECT fenced_token FROM {schema}.job_state WHERE job_key = %(job_key)s) AS current;

-- name: result_put
-- The seed's conditional upsert, accepting a retry by the same token. A token that was never
-- issued for this key is refused, so a typo cannot fence out every future writer.
WITH issued AS MATERIALIZED (
    SELECT fencing_token FROM {schema}.job_leases WHERE job_key = %(job_key)s
), written AS (
    INSERT INTO {schema}.report_results AS r (job_key, payload, applied_fencing_token, written_at)
    SELECT %(job_key)s, %(payload)s, %(token)s, clock_timestamp()
    WHERE EXISTS (SELECT 1 FROM issued WHERE issued.fencing_token >= %(token)s)
    ON CONFLICT (job_key) DO UPDATE
    SET payload = excluded.payload,
        applied_fencing_token = excluded.applied_fencing_token,
        written_at = excluded.written_at
    WHERE r.applied_fencing_token <= excluded.applied_fencing_token
    RETURNING r.applied_fencing_token, r.written_at
), refused AS (
    -- A refused write's record (migration 18), in the same statement: nothing was written
    -- and the token had been issued (the caller raises StaleTokenError; a token never issued
    -- is TokenNotIssued, not recorded). The accepted write's path inserts nothing.
    INSERT INTO {schema}.lease_events (job_key, token, event, detail)
    SELECT %(job_key)s, %(token)s, 'refused', 'results.put'
    WHERE NOT EXISTS (SELECT 1 FROM written)
      AND EXISTS (SELECT 1 FROM issued WHERE issued.fencing_token >= %(token)s)
)
SELECT (SELECT applied_fencing_token FROM written) AS applied,
       (SELECT written_at FROM written) AS written_at,
       (SELECT applied_fencing_token FROM {schema}.report_results WHERE job_key = %(job_key)s)
           AS current,
       (SELECT fencing_token FROM issued) AS issued;

-- name: result_put_strict
-- results.put(strict=True): the rule fence() applies, in one statement. The write happens only
-- while the token is the newest takeover and its lease is unexpired by the database clock;
-- the fence row is updated first (as fence() does), so a concurrent takeover waits for this
-- statement, or for the caller's transaction when it runs on the caller's connection, and a
-- takeover that committed first makes the UPDATE match nothing (EvalPlanQual re-checks
-- s.token on the new row version). Unlike the seed's rule, a holder whose lease expired is
-- refused even before any successor has written. A retry with the same token while the
-- lease is live is accepted. With %(set_idle)s (the caller's transaction), the transaction
-- gets the idle timeout fence() sets: the lease TTL.
WITH fenced AS (
    UPDATE {schema}.job_state AS s
    SET fenced_token = s.token, fenced_at = clock_timestamp()
    FROM {schema}.job_leases AS l
    WHERE s.job_key = %(job_key)s AND s.token = %(token)s
      AND l.job_key = s.job_key AND l.fencing_token = s.token
      AND l.lease_until >= clock_timestamp()
    RETURNING s.token, l.lease_ttl
), idle AS (
    SELECT set_config('idle_in_transaction_session_timeout',
                      (ceil(extract(epoch FROM f.lease_ttl) * 1000))::bigint::text, true)
    FROM fenced AS f
    WHERE %(set_idle)s::boolean
), written AS (
    INSERT INTO {schema}.report_results AS r (job_key, payload, applied_fencing_token, written_at)
    SELECT %(job_key)s, %(payload)s, %(token)s, clock_timestamp()
    FROM fenced
    ON CONFLICT (job_key) DO UPDATE
    SET payload = excluded.payload,
        applied_fencing_token = excluded.applied_fencing_token,
        written_at = excluded.written_at
    WHERE r.applied_fencing_token <= excluded.applied_fencing_token
    RETURNING r.applied_fencing_token, r.written_at
), refused AS (
    -- As in result_put: a refused write of an issued token is recorded (migration 18). On the
    -- caller's connection it commits or rolls back with the caller's transaction.
    INSERT INTO {schema}.lease_events (job_key, token, event, detail)
    SELECT %(job_key)s, %(token)s, 'refused', 'results.put strict'
    WHERE NOT EXISTS (SELECT 1 FROM written)
      AND EXISTS (SELECT 1 FROM {schema}.job_leases
                  WHERE job_key = %(job_key)s AND fencing_token >= %(token)s)
)
SELECT (SELECT applied_fencing_token FROM written) AS applied,
       (SELECT written_at FROM written) AS written_at,
       (SELECT count(*) FROM idle) AS idle_set,
       (SELECT fencing_token FROM {schema}.job_leases WHERE job_key = %(job_key)s) AS issued;

-- name: lease_event_refused
-- fence() refused a token (migration 18's record of it, for the key's timeline). fence() runs
-- in the caller's transaction, which rolls back on the refusal, so this is a separate
-- statement in autocommit on the client's pool, sent on the refusal path only (a fence that
-- passes costs nothing more). Only a token that had been issued is recorded.
INSERT INTO {schema}.lease_events (job_key, token, event, detail)
SELECT %(job_key)s, %(token)s, 'refused', %(detail)s
WHERE EXISTS (SELECT 1 FROM {schema}.job_leases
              WHERE job_key = %(job_key)s AND fencing_token >= %(token)s);

-- name: result_get
SELECT job_key, payload, applied_fencing_token, written_at
FROM {schema}.report_results
WHERE job_key = %(job_key)s;

-- name: now
SELECT clock_timestamp();
