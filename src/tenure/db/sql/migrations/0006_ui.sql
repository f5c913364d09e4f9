-- tenure schema, version 6: what the web dashboard (`tenure ui`) needs. {schema} is
-- substituted as an identifier.

-- Live updates: run history changes (a run starts, ends, is skipped or marked lost) are
-- announced on the dashboard's own channel, so an open page refreshes within a second
-- without polling. A separate channel from the scheduler's: every worker LISTENs there and
-- runs a claim on each notification, and a run ending is no reason for that. One
-- notification per statement (not per row): payload is the JSON array of the job keys the
-- statement touched, or '*' when that would not fit a notification. The channel is derived
-- from the schema name here and in tenure.ui.live.channel_name (same rule, so the two agree).
CREATE FUNCTION {schema}.tenure_ui_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    keys    text;
    channel text := 'tenure_ui_' || TG_TABLE_SCHEMA;
BEGIN
    SELECT json_agg(DISTINCT job_key)::text INTO keys FROM changed;
    IF keys IS NULL THEN
        RETURN NULL;  -- the statement changed no row
    END IF;
    IF octet_length(keys) > 7000 THEN
        keys := '*';
    END IF;
    IF octet_length(channel) > 63 THEN
        channel := 'tenure_ui_'
            || left(encode(sha256(convert_to(TG_TABLE_SCHEMA, 'UTF8')), 'hex'), 32);
    END IF;
    PERFORM pg_notify(channel, keys);
    RETURN NULL;
END
$$;

-- Transition tables allow one event per trigger, hence two.
CREATE TRIGGER job_runs_ui_insert AFTER INSERT ON {schema}.job_runs
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.tenure_ui_notify();
CREATE TRIGGER job_runs_ui_update AFTER UPDATE ON {schema}.job_runs
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.tenure_ui_notify();

-- The job timeline reads one job's runs in a time window (newest first); job_runs_history
-- (job_key, run_id) would walk every run of a busy job to find the window's edge.
CREATE INDEX job_runs_timeline ON {schema}.job_runs (job_key, recorded_at);
