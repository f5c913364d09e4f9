-- Named queries of `tenure verify` (src/tenure/verify/). They only ever touch the run's own
-- throwaway schema: {schema} is that schema, created by the run and dropped afterwards.

-- name: verify_setup
-- The run's evidence tables, next to tenure's (migrated first) in the run's schema.
-- verify_lease_history: every committed change of a job_leases row (a row trigger): the
-- ground truth of issued tokens, renewals and releases, including those whose outcome the
-- worker never learned, with the previous row version (old_token, old_until), so the checker
-- sees what each takeover and renewal replaced. Updates of one key serialise on the row lock,
-- so for one key the id order is the commit order.
-- verify_ledger: the business table a fenced transaction writes; token_at_commit is read by a
-- deferred trigger just before the transaction commits: a token higher than the row's own
-- means a successor's takeover had committed first (a strict-fencing violation).
-- verify_results_history: every version report_results took (row trigger after the upsert
-- locked the row: for one key the id order is the commit order).
CREATE TABLE {schema}.verify_lease_history (
    id           bigserial   PRIMARY KEY,
    job_key      text        NOT NULL,
    change       text        NOT NULL,
    token        bigint      NOT NULL,
    owner        uuid        NOT NULL,
    lease_until  timestamptz NOT NULL,
    acquired_at  timestamptz NOT NULL,
    renewed_at   timestamptz,
    old_token    bigint,
    old_owner    uuid,
    old_until    timestamptz,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE {schema}.verify_ledger (
    id               bigserial   PRIMARY KEY,
    job_key          text        NOT NULL,
    token            bigint      NOT NULL,
    wid              text        NOT NULL UNIQUE,
    token_at_commit  bigint,
    at               timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE {schema}.verify_results_history (
    id       bigserial   PRIMARY KEY,
    job_key  text        NOT NULL,
    token    bigint      NOT NULL,
    wid      text,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION {schema}.verify_record_lease() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {schema}.verify_lease_history
            (job_key, change, token, owner, lease_until, acquired_at, renewed_at)
        VALUES (NEW.job_key, 'takeover', NEW.fencing_token, NEW.lease_owner, NEW.lease_until,
                NEW.acquired_at, NEW.renewed_at);
    ELSIF (NEW.fencing_token, NEW.lease_owner, NEW.lease_until, NEW.renewed_at)
          IS DISTINCT FROM (OLD.fencing_token, OLD.lease_owner, OLD.lease_until, OLD.renewed_at)
    THEN
        INSERT INTO {schema}.verify_lease_history
            (job_key, change, token, owner, lease_until, acquired_at, renewed_at,
             old_token, old_owner, old_until)
        VALUES (NEW.job_key,
                CASE WHEN NEW.fencing_token IS DISTINCT FROM OLD.fencing_token THEN 'takeover'
                     WHEN NEW.lease_until < OLD.lease_until THEN 'release'
                     WHEN NEW.renewed_at IS DISTINCT FROM OLD.renewed_at THEN 'renew'
                     ELSE 'other' END,
                NEW.fencing_token, NEW.lease_owner, NEW.lease_until, NEW.acquired_at,
                NEW.renewed_at, OLD.fencing_token, OLD.lease_owner, OLD.lease_until);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER verify_record_lease AFTER INSERT OR UPDATE ON {schema}.job_leases
FOR EACH ROW EXECUTE FUNCTION {schema}.verify_record_lease();
CREATE FUNCTION {schema}.verify_token_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {schema}.verify_ledger
    SET token_at_commit = (SELECT fencing_token FROM {schema}.job_leases
                           WHERE job_key = NEW.job_key)
    WHERE id = NEW.id;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER verify_token_at_commit AFTER INSERT ON {schema}.verify_ledger
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION {schema}.verify_token_at_commit();
CREATE FUNCTION {schema}.verify_record_result() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.verify_results_history (job_key, token, wid)
    VALUES (NEW.job_key, NEW.applied_fencing_token, NEW.payload->>'wid');
    RETURN NULL;
END $$;
CREATE TRIGGER verify_record_result AFTER INSERT OR UPDATE ON {schema}.report_results
FOR EACH ROW EXECUTE FUNCTION {schema}.verify_record_result();

-- name: verify_ledger_insert
INSERT INTO {schema}.verify_ledger (job_key, token, wid)
VALUES (%(key)s, %(token)s, %(wid)s)
RETURNING id, at;

-- name: verify_app_timeouts
-- The application's own transaction never waits long (transaction-local: pooler-safe).
SELECT set_config('lock_timeout', '2s', true), set_config('statement_timeout', '5s', true);

-- name: verify_unfenced_result
-- --unsafe-no-fence: what a naive application does, the last writer wins whatever its token.
INSERT INTO {schema}.report_results AS r (job_key, payload, applied_fencing_token, written_at)
VALUES (%(key)s, %(payload)s, %(token)s, clock_timestamp())
ON CONFLICT (job_key) DO UPDATE
SET payload = excluded.payload,
    applied_fencing_token = excluded.applied_fencing_token,
    written_at = excluded.written_at
RETURNING applied_fencing_token, written_at;

-- name: verify_progress
SELECT (SELECT count(*) FROM {schema}.verify_lease_history WHERE change = 'takeover'),
       clock_timestamp();

-- name: verify_snapshot_lease_history
SELECT id, job_key, change, token, owner::text AS owner, lease_until, acquired_at, renewed_at,
       old_token, old_owner::text AS old_owner, old_until, at
FROM {schema}.verify_lease_history
ORDER BY id;

-- name: verify_snapshot_ledger
SELECT id, job_key, token, wid, token_at_commit, at
FROM {schema}.verify_ledger
ORDER BY id;

-- name: verify_snapshot_results_history
SELECT id, job_key, token, wid, at
FROM {schema}.verify_results_history
ORDER BY id;

-- name: verify_snapshot_results
SELECT job_key, applied_fencing_token AS token, payload->>'wid' AS wid
FROM {schema}.report_results
ORDER BY job_key;

-- name: verify_snapshot_leases
SELECT job_key, fencing_token AS token, lease_until
FROM {schema}.job_leases
ORDER BY job_key;

-- name: verify_busy_backends
-- Backends still working for this run (their last statement names the run's schema, and
-- they are in a transaction or running one): the checker waits for them before it reads.
SELECT count(*)
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND datname = current_database()
  AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')
  AND strpos(query, %(schema_name)s) > 0;

-- name: verify_terminate
-- The terminate fault: end the backends serving this run's workers, identified by their last
-- statement naming the run's own schema (nobody else's connections), never the checker's.
SELECT count(pg_terminate_backend(pid))
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND datname = current_database()
  AND backend_type = 'client backend'
  AND application_name NOT LIKE 'tenure verify%%'
  AND strpos(query, %(schema_name)s) > 0;

-- name: verify_can_signal
-- Whether this role may terminate other roles' backends (the pooler's, say).
SELECT r.rolsuper OR pg_has_role(current_user, 'pg_signal_backend', 'MEMBER'),
       current_user::text
FROM pg_roles AS r
WHERE r.rolname = current_user;

-- name: verify_clock
SELECT clock_timestamp(), current_setting('server_version'), current_database()::text;

-- name: verify_drop
DROP SCHEMA IF EXISTS {schema} CASCADE;
