-- tenure schema, version 5: poison-job quarantine and job ownership by app.
-- {schema} is substituted as an identifier.

ALTER TABLE {schema}.scheduled_jobs
    -- The app that owns the definition (Scheduler(name=...), default MODULE:ATTR as given
    -- to `tenure worker`). Another app's worker refuses to redefine the job unless told to
    -- adopt it, and claims only its own app's jobs. NULL: registered before version 5; the
    -- next registration stamps it.
    ADD COLUMN app text CHECK (length(app) BETWEEN 1 AND 500),
    -- Quarantine the job after this many consecutive runs ended with their worker gone (no
    -- finish record when the lease expired: os._exit, a segfault, the OOM killer). NULL:
    -- never.
    ADD COLUMN quarantine_after integer DEFAULT 3 CHECK (quarantine_after >= 1),
    -- Consecutive runs that ended with their worker gone; a run that records its end (any
    -- outcome) resets it. Written only by statements fenced on claim_token.
    ADD COLUMN crash_streak integer NOT NULL DEFAULT 0 CHECK (crash_streak >= 0),
    -- Set with paused = true when the streak reached quarantine_after; cleared by resume.
    ADD COLUMN quarantined_at timestamptz,
    ADD COLUMN quarantine_reason text,
    ADD CONSTRAINT scheduled_jobs_quarantine_reason
        CHECK ((quarantined_at IS NULL) = (quarantine_reason IS NULL)),
    ADD CONSTRAINT scheduled_jobs_quarantine_paused CHECK (quarantined_at IS NULL OR paused);
