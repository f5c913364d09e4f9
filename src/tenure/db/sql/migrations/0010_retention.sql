-- tenure schema, version 10: retention. History is pruned by age, in short batches (see
-- db/sql/retention.sql and docs/retention.md); these indexes let each batch find its rows
-- without scanning the table. {schema} is substituted as an identifier.
-- On a large existing outbox or inbox, CREATE INDEX blocks writes to that table while it
-- builds (a migration runs in one transaction, so not CONCURRENTLY): migrate in a quiet
-- moment, or create these indexes CONCURRENTLY by hand first with the same names.

-- The last database instant at which a run could still name this slot: a periodic slot
-- (--every, or a cron tick of @tenure.once) is named only while the database clock is
-- nearest to its time, so after its time plus half the period no run can ask for it again.
-- NULL: a slot named by the caller (--slot VALUE alone), which may be asked for again at any
-- time; such rows are never pruned by age (nor rows written before version 10).
ALTER TABLE {schema}.exec_slots ADD COLUMN open_until timestamptz;
CREATE INDEX exec_slots_open_until ON {schema}.exec_slots (open_until)
    WHERE open_until IS NOT NULL;

-- Delivered messages, oldest delivery first: what retention deletes.
CREATE INDEX outbox_delivered ON {schema}.outbox (delivered_at) WHERE state = 'delivered';
-- The oldest message that may still be delivered (pending, or dead and re-drivable): inbox
-- rows applied after it was created are kept, whatever their age.
CREATE INDEX outbox_undelivered ON {schema}.outbox (created_at) WHERE state <> 'delivered';

CREATE INDEX inbox_applied ON {schema}.inbox (applied_at);
