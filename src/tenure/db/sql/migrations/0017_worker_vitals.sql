-- tenure schema, version 17 (issue 29): a worker's presence row carries how it is doing, for
-- the dashboard's workers page. {schema} is substituted as an identifier.

-- Written by the worker's presence beat (scheduler/presence.py), the statement it already
-- sends every PRESENCE_EVERY: loop_lag, the longest its event loop was blocked since the
-- previous beat (seconds, scheduler/looplag.py); saturated, whether it is falling behind
-- its due slots (scheduler/saturation.py). NULL until its first beat, and for a worker of
-- an earlier version. Adding nullable columns rewrites nothing.
ALTER TABLE {schema}.scheduler_workers
    ADD COLUMN loop_lag double precision,
    ADD COLUMN saturated boolean;
