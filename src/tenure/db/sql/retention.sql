-- Named queries of retention: history pruned by age (docs/retention.md says what is kept and
-- why it is safe). {schema} is substituted as an identifier. The run history of the scheduler
-- is pruned by sched_prune (scheduler.sql), with the same shape.
--
-- Each statement deletes at most %(batch)s rows (the pruner repeats it until a batch comes
-- back short), so each transaction is short and locks only the rows it deletes. SKIP
-- LOCKED: two pruners at once (workers, relays, tenure exec, tenure prune) take different
-- rows instead of waiting for each other, and a row a claim or a write has locked is left
-- for the next pass. %(retention)s is an interval; every time is the database clock.

-- name: retention_exec_runs
-- tenure exec's run history, by when the run started. A row still 'running' is deleted only
-- if its run cannot be running: its lease is gone, expired, or taken over by a newer token
-- (its tenure exec died; `tenure status` shows it as abandoned). A live lease keeps it.
WITH gone AS (
    DELETE FROM {schema}.exec_runs
    WHERE run_id IN (
        SELECT r.run_id
        FROM {schema}.exec_runs AS r
        LEFT JOIN {schema}.job_leases AS l ON l.job_key = r.job_key
        WHERE r.recorded_at < clock_timestamp() - %(retention)s::interval
          AND (r.outcome <> 'running'
               OR l.job_key IS NULL
               OR l.fencing_token <> r.token
               OR l.lease_until < clock_timestamp())
        LIMIT %(batch)s
        FOR UPDATE OF r SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: retention_exec_slots
-- Completed slots that no run can name again: open_until (the end of the slot's window, set
-- for periodic slots only) is older than the retention. Slots named by the caller have no
-- open_until and are kept: a caller may ask for them again at any time.
WITH gone AS (
    DELETE FROM {schema}.exec_slots
    WHERE (job_key, slot) IN (
        SELECT job_key, slot
        FROM {schema}.exec_slots
        WHERE open_until < clock_timestamp() - %(retention)s::interval
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: retention_outbox
-- Delivered messages, by delivery time. Pending and dead messages are never deleted here
-- (pending ones are still to be delivered, dead ones to be re-driven or purged by an
-- operator: `tenure outbox purge --state dead`). A delivered message never changes state
-- again, so the row deleted is the row selected.
WITH gone AS (
    DELETE FROM {schema}.outbox
    WHERE id IN (
        SELECT id
        FROM {schema}.outbox
        WHERE state = 'delivered'
          AND delivered_at < clock_timestamp() - %(retention)s::interval
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: retention_inbox
-- Consumers' claims, by when they were applied. A claim is the consumer's memory that a key
-- was applied: it is deleted only once no delivery of that key can come again. The
-- retention is the age argument (longer than any redelivery: docs/retention.md); on top of
-- it, while any message of this schema's outbox may still be delivered (pending, or dead and
-- re-drivable), no claim applied after that message was created is deleted, whatever its
-- age (least() ignores the NULL of an outbox with nothing undelivered).
WITH gone AS (
    DELETE FROM {schema}.inbox
    WHERE (consumer, key) IN (
        SELECT consumer, key
        FROM {schema}.inbox
        WHERE applied_at < least(
            clock_timestamp() - %(retention)s::interval,
            (SELECT min(created_at) FROM {schema}.outbox WHERE state <> 'delivered'))
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: retention_lease_events
-- The lease-event record (migration 18: takeovers and refused writes of keys without run
-- history), by when each happened (lease_events_at). Nothing decides anything from it: the
-- tokens and fences are job_leases and job_state, which are never pruned.
WITH gone AS (
    DELETE FROM {schema}.lease_events
    WHERE (job_key, id) IN (
        SELECT job_key, id
        FROM {schema}.lease_events
        WHERE at < clock_timestamp() - %(retention)s::interval
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: retention_preview
-- `tenure prune --dry-run`: how many rows each statement above (and sched_prune) would
-- delete now, with the same conditions, and the age of the oldest row each table keeps
-- back that it would otherwise delete (inbox: held by an undelivered message).
SELECT
    (SELECT count(*) FROM {schema}.job_runs
     WHERE recorded_at < clock_timestamp() - %(retention)s::interval
       AND outcome <> 'running') AS job_runs,
    (SELECT count(*)
     FROM {schema}.exec_runs AS r
     LEFT JOIN {schema}.job_leases AS l ON l.job_key = r.job_key
     WHERE r.recorded_at < clock_timestamp() - %(retention)s::interval
       AND (r.outcome <> 'running'
            OR l.job_key IS NULL
            OR l.fencing_token <> r.token
            OR l.lease_until < clock_timestamp())) AS exec_runs,
    (SELECT count(*) FROM {schema}.exec_slots
     WHERE open_until < clock_timestamp() - %(retention)s::interval) AS exec_slots,
    (SELECT count(*) FROM {schema}.outbox
     WHERE state = 'delivered'
       AND delivered_at < clock_timestamp() - %(retention)s::interval) AS outbox,
    (SELECT count(*) FROM {schema}.inbox
     WHERE applied_at < least(
         clock_timestamp() - %(inbox_retention)s::interval,
         (SELECT min(created_at) FROM {schema}.outbox WHERE state <> 'delivered'))) AS inbox,
    (SELECT count(*) FROM {schema}.lease_events
     WHERE at < clock_timestamp() - %(retention)s::interval) AS lease_events;
