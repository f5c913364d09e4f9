-- tenure schema, version 16: `tenure exec` runs reach open dashboard pages live. {schema} is
-- substituted as an identifier.

-- exec_runs (migration 7) changes are announced on the dashboard's channel as job_runs'
-- are (migration 6, the same function: one notification per statement with the keys it
-- touched), so a `tenure exec` key's page refreshes when a run starts and ends.
CREATE TRIGGER exec_runs_ui_insert AFTER INSERT ON {schema}.exec_runs
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.tenure_ui_notify();
CREATE TRIGGER exec_runs_ui_update AFTER UPDATE ON {schema}.exec_runs
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.tenure_ui_notify();
