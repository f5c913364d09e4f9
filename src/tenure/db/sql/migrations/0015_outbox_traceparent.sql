-- tenure schema, version 15: an outbox message remembers the trace it was enqueued in (the
-- W3C traceparent of the span current at enqueue, with OpenTelemetry), so its delivery and
-- the webhook's receiver join the trace of the run that enqueued it. NULL without tracing.
-- {schema} is substituted as an identifier.
ALTER TABLE {schema}.outbox ADD COLUMN traceparent text
    CONSTRAINT outbox_traceparent_length CHECK (length(traceparent) <= 512);
