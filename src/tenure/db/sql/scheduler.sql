-- Named queries of the scheduler (src/tenure/scheduler/). Each runs as ONE statement in
-- autocommit on tenure's pool. Due-ness and every recorded time come from clock_timestamp();
-- slot times are computed in Python (cronsim) from database times only, and passed in.

-- name: sched_register
-- Upsert app %(app)s's job definitions (sorted by key, so concurrent registrations lock rows
-- in the same order). A definition belongs to the app that registered it: if another app
-- owns any of these keys, nothing is written (unless %(adopt)s) and those keys come back as
-- conflict rows, so the worker refuses to start instead of flipping the definition back and
-- forth on every deploy of either app. The owner is re-checked on each locked row (a
-- concurrent registration by another app between the read and the write keeps its row).
-- An identical definition writes nothing; a changed one bumps the revision and, if the
-- schedule itself changed, restarts it at the first slot after now; a change of owner alone
-- (adopt, or stamping a row registered before owners existed) keeps the revision. Returns
-- one row per inserted or changed job, with the old definition (NULLs for a new job) so the
-- worker can log what changed. The job_state row (token 0 until the first claim) lets the
-- claim lock it with SKIP LOCKED.
WITH incoming AS (
    SELECT *
    FROM unnest(%(keys)s::text[], %(crons)s::text[], %(everys)s::interval[],
                %(timezones)s::text[], %(ttls)s::interval[], %(misfires)s::text[],
                %(graces)s::interval[], %(on_crashes)s::text[], %(next_slots)s::timestamptz[],
                %(quarantine_afters)s::integer[])
        AS i(job_key, cron, every, timezone, ttl, misfire, misfire_grace, on_crash, next_slot,
             quarantine_after)
), old AS MATERIALIZED (
    SELECT j.job_key, j.cron, j.every, j.timezone, j.ttl, j.misfire, j.misfire_grace,
           j.on_crash, j.defined_by, j.defined_at, j.app, j.revision, j.quarantine_after,
           j.task
    FROM {schema}.scheduled_jobs AS j
    WHERE j.job_key IN (SELECT job_key FROM incoming)
), conflicts AS MATERIALIZED (
    -- A runtime schedule's key (task set) is never taken over by code, adopt or not.
    SELECT o.job_key, o.app, o.defined_by, o.defined_at, o.task
    FROM old AS o
    WHERE (o.app IS NOT NULL AND o.app <> %(app)s AND NOT %(adopt)s::boolean)
       OR o.task IS NOT NULL
), upserted AS (
    INSERT INTO {schema}.scheduled_jobs AS j
        (job_key, cron, every, timezone, ttl, misfire, misfire_grace, on_crash, defined_at,
         defined_by, next_slot, quarantine_after, app)
    SELECT i.job_key, i.cron, i.every, i.timezone, i.ttl, i.misfire, i.misfire_grace,
           i.on_crash, clock_timestamp(), %(defined_by)s, i.next_slot, i.quarantine_after,
           %(app)s
    FROM incoming AS i
    LEFT JOIN old AS o ON o.job_key = i.job_key
    WHERE NOT EXISTS (SELECT 1 FROM conflicts)
      -- Only new or changed definitions: ON CONFLICT locks the existing row even when its
      -- WHERE then writes nothing, so an identical one would wait for every claim, start and
      -- finish holding its row (a worker joining a busy fleet of 100,000s of jobs timed out).
      AND (o.job_key IS NULL
           OR (o.cron, o.every, o.timezone, o.ttl, o.misfire, o.misfire_grace, o.on_crash,
               o.quarantine_after, o.app)
              IS DISTINCT FROM (i.cron, i.every, i.timezone, i.ttl, i.misfire,
                                i.misfire_grace, i.on_crash, i.quarantine_after,
                                %(app)s::text))
    ORDER BY i.job_key
    ON CONFLICT (job_key) DO UPDATE
    SET cron = excluded.cron,
        every = excluded.every,
        timezone = excluded.timezone,
        ttl = excluded.ttl,
        misfire = excluded.misfire,
        misfire_grace = excluded.misfire_grace,
        on_crash = excluded.on_crash,
        quarantine_after = excluded.quarantine_after,
        app = excluded.app,
        revision = CASE
            WHEN (j.cron, j.every, j.timezone, j.ttl, j.misfire, j.misfire_grace, j.on_crash,
                  j.quarantine_after)
                 IS DISTINCT FROM (excluded.cron, excluded.every, excluded.timezone,
                                   excluded.ttl, excluded.misfire, excluded.misfire_grace,
                                   excluded.on_crash, excluded.quarantine_after)
            THEN j.revision + 1 ELSE j.revision END,
        defined_at = excluded.defined_at,
        defined_by = excluded.defined_by,
        next_slot = CASE
            WHEN (j.cron, j.every, j.timezone)
                 IS DISTINCT FROM (excluded.cron, excluded.every, excluded.timezone)
            THEN excluded.next_slot ELSE j.next_slot END
    WHERE (j.cron, j.every, j.timezone, j.ttl, j.misfire, j.misfire_grace, j.on_crash,
           j.quarantine_after, j.app)
          IS DISTINCT FROM (excluded.cron, excluded.every, excluded.timezone, excluded.ttl,
                            excluded.misfire, excluded.misfire_grace, excluded.on_crash,
                            excluded.quarantine_after, excluded.app)
      AND (j.app IS NULL OR j.app = excluded.app OR %(adopt)s::boolean)
      AND j.task IS NULL
    RETURNING j.job_key, j.revision, j.next_slot
), state AS (
    INSERT INTO {schema}.job_state (job_key, token)
    SELECT job_key, 0 FROM incoming
    WHERE NOT EXISTS (SELECT 1 FROM conflicts)
    ORDER BY job_key
    ON CONFLICT (job_key) DO NOTHING
)
SELECT u.job_key, u.revision, u.next_slot, o.cron, o.every, o.timezone, o.ttl, o.misfire,
       o.misfire_grace, o.on_crash, o.defined_by, o.defined_at, o.app,
       u.revision IS DISTINCT FROM o.revision AS redefined, false AS conflict,
       pg_notify(%(channel)s, 'defined')::text AS notified, NULL::text AS task
FROM upserted AS u
LEFT JOIN old AS o ON o.job_key = u.job_key
UNION ALL
SELECT c.job_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, c.defined_by,
       c.defined_at, c.app, false, true, NULL, c.task
FROM conflicts AS c;

-- name: sched_claim
-- Claim up to %(limit)s due jobs in ONE statement, for a worker of app %(app)s that runs every
-- job key of its app (or not yet stamped with one) except %(exclude)s. A job is due when its
-- due_at has passed by the database clock (its next slot; -infinity for a pending retry or
-- trigger; for a claimed or running job, when its worker could be gone: migration 11), it
-- is not paused, its lease is not live, and no other worker is
-- claiming it (SKIP LOCKED on the job row and on its fence row: a job whose previous holder
-- still has a fenced transaction open is left for a later claim instead of blocking the
-- batch). Each claimed job's lease is taken over with the core acquire's semantics: fresh
-- owner, token + 1 (and the timeline floor, see queries.sql acquire), the ON CONFLICT WHERE
-- re-checked on the locked row, job_state.token moved in the same statement (strict
-- fencing). claim_token records the
-- newest claim: the start and finish statements are fenced on it.
-- Fire-ahead: a job whose next slot comes within %(ahead)s seconds is claimed now, so that
-- the worker can plan it and record its start at the slot itself instead of after a claim's
-- round trip (docs/safety.md, "Claiming ahead of the slot"). Only jobs whose TTL is at least
-- ten times that are claimed ahead: the lease is held a little longer than the run, never
-- more than the tenth of the TTL that the renewal's safety margin already allows for.
-- A last row (job_key NULL) says when the worker should look again: the next due_at (less
-- the fire-ahead), the earliest expiry of a live lease on a due job, or now if due jobs were
-- left unclaimed (NULL when the batch is full: the worker claims again at once).
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now,
           clock_timestamp() + make_interval(secs => %(ahead)s) AS horizon,
           make_interval(secs => %(ahead)s) AS ahead,
           make_interval(secs => 10 * %(ahead)s) AS ahead_ttl
), due AS MATERIALIZED (
    SELECT j.job_key, j.cron, j.every, j.timezone, j.ttl, j.misfire, j.misfire_grace,
           j.on_crash, j.revision, j.next_slot, j.done_slot, j.running_slot, j.running_kind,
           j.running_token, j.running_attempt, j.trigger_at, j.crash_streak,
           j.quarantine_after,
           -- A runtime schedule's definition, read in the claim itself (migration 14): the
           -- start is refused if its revision moved since, so a run never starts under a
           -- definition older than the newest committed change.
           j.task, j.args, j.run_at, j.starts_at, j.ends_at, j.jitter, j.max_runs,
           j.runs_started, j.overlap, j.backfill_next, j.backfill_to,
           -- The unfinished run has no finish record: its worker is gone (a worker that
           -- lost the lease or shut down records its end with sched_finish). Its history row
           -- is missing, or 'running' (a long run's, sched_running), or 'abandoned': its body
           -- did not stop at its worker's shutdown, which stopped without it (counted toward
           -- quarantine as a crash is). Not gone while its worker still has a connection
           -- open (issue 29): a worker whose loop a job blocked lost the lease, but is alive
           -- and records the run's end itself; a killed worker's connections close at once.
           (j.running_token IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM {schema}.job_runs AS r
               WHERE r.job_key = j.job_key AND r.token = j.running_token
                 AND r.started_at IS NOT NULL
                 AND r.outcome NOT IN ('running', 'abandoned'))
            AND NOT EXISTS (
               SELECT 1 FROM pg_stat_activity AS a
               WHERE j.running_worker IS NOT NULL
                 AND a.application_name = 'tenure worker ' || j.running_worker)) AS prior_gone,
           -- When the lease before this claim ended (expired or released): slots that came
           -- due while another holder kept the job are not this worker falling behind.
           (SELECT l.lease_until FROM {schema}.job_leases AS l
            WHERE l.job_key = j.job_key) AS freed_at
    FROM {schema}.scheduled_jobs AS j
    JOIN {schema}.job_state AS s ON s.job_key = j.job_key
    WHERE NOT j.paused
      AND j.due_at <= (SELECT horizon FROM clock)
      AND (j.due_at <= (SELECT now FROM clock) OR j.ttl >= (SELECT ahead_ttl FROM clock))
      AND j.job_key <> ALL (%(exclude)s::text[])
      AND (j.app IS NULL OR j.app = %(app)s)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.job_leases AS l
          WHERE l.job_key = j.job_key AND l.lease_until >= clock_timestamp())
    ORDER BY j.due_at
    LIMIT %(limit)s
    FOR UPDATE OF j, s SKIP LOCKED
), taken AS (
    INSERT INTO {schema}.job_leases AS l
        (job_key, lease_owner, lease_until, fencing_token, lease_ttl, acquired_at, renewed_at)
    SELECT d.job_key, gen_random_uuid(), clock_timestamp() + d.ttl,
           {token_floor},
           d.ttl, clock_timestamp(), clock_timestamp()
    FROM due AS d
    ORDER BY d.job_key
    -- The takeover: a fragment of queries.sql (acquire takes over the same way).
    {takeover}
    RETURNING l.job_key, l.lease_owner, l.fencing_token, l.lease_until
), state AS (
    INSERT INTO {schema}.job_state AS s (job_key, token)
    SELECT job_key, fencing_token FROM taken
    ON CONFLICT (job_key) DO UPDATE SET token = excluded.token
), mark AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET claim_token = t.fencing_token, claimed_at = clock_timestamp(),
        -- Not due until this lease has expired: the claims that follow (this worker's and
        -- others') do not read the job again while its start is being recorded. An `every`
        -- job claimed for its next slot is due again at the earlier of the slot after it and
        -- that expiry: where its start puts it, so the start's update moves no index entry
        -- and can be heap-only (docs/safety.md, "When a claimed or running job is due
        -- again"). A guess: the start still sets what its plan says.
        held_until = CASE
            WHEN j.every IS NOT NULL AND j.running_slot IS NULL AND j.trigger_at IS NULL
                 AND j.backfill_next IS NULL AND j.jitter IS NULL
                 AND j.next_slot + make_interval(secs => extract(epoch FROM j.every))
                     > clock_timestamp()
            THEN least(j.next_slot + make_interval(secs => extract(epoch FROM j.every)),
                       t.lease_until)
            ELSE t.lease_until END
    FROM taken AS t
    WHERE j.job_key = t.job_key
), ready AS (
    -- Only when the batch is not full: a worker that got a full batch claims again at once
    -- without reading it, and under load these scans cost more than the claim itself.
    SELECT CASE WHEN (SELECT count(*) FROM taken) < %(limit)s THEN least(
        -- The next job to come within the fire-ahead (one that may not be claimed ahead
        -- for its short TTL wakes the worker early once, then by the next line).
        (SELECT min(j.due_at) - c.ahead FROM {schema}.scheduled_jobs AS j
         WHERE NOT j.paused AND j.due_at > c.horizon
           AND j.job_key <> ALL (%(exclude)s::text[])
           AND (j.app IS NULL OR j.app = %(app)s)),
        (SELECT min(j.due_at) FROM {schema}.scheduled_jobs AS j
         WHERE NOT j.paused AND j.due_at > c.now AND j.due_at <= c.horizon
           AND j.ttl < c.ahead_ttl
           AND j.job_key <> ALL (%(exclude)s::text[])
           AND (j.app IS NULL OR j.app = %(app)s)),
        (SELECT min(l.lease_until)
         FROM {schema}.scheduled_jobs AS j
         JOIN {schema}.job_leases AS l ON l.job_key = j.job_key
         WHERE NOT j.paused AND j.due_at <= c.horizon AND l.lease_until >= c.now
           AND j.job_key <> ALL (%(exclude)s::text[])
           AND (j.app IS NULL OR j.app = %(app)s)),
        (SELECT c.now FROM {schema}.scheduled_jobs AS j
         WHERE NOT j.paused AND j.due_at <= c.horizon
           AND (j.due_at <= c.now OR j.ttl >= c.ahead_ttl)
           AND j.job_key <> ALL (%(exclude)s::text[])
           AND (j.app IS NULL OR j.app = %(app)s)
           AND j.job_key NOT IN (SELECT job_key FROM due)
           AND NOT EXISTS (
               SELECT 1 FROM {schema}.job_leases AS l
               WHERE l.job_key = j.job_key AND l.lease_until >= c.now)
         LIMIT 1)
    ) END AS ready_at, c.now
    FROM clock AS c
)
-- The lease rows taken and the job rows read come back as separate rows, joined by job_key
-- in the worker (scheduler.claim.claims_from_rows): the planner sees two CTEs of one
-- estimated row each and joins them by a nested loop, which for a batch of n claims
-- compared n * n keys (a batch of 1,000 spent most of its time there).
-- The first branch names the columns (scheduler.rows.ClaimRow).
SELECT t.job_key, t.lease_owner, t.fencing_token, t.lease_until, NULL AS cron, NULL AS every,
       NULL AS timezone, NULL AS ttl, NULL AS misfire, NULL AS misfire_grace,
       NULL AS on_crash, NULL AS revision, NULL AS next_slot, NULL AS done_slot,
       NULL AS running_slot, NULL AS running_kind, NULL AS running_token,
       NULL AS running_attempt, NULL AS trigger_at, NULL AS now, NULL AS ready_at,
       NULL AS prior_gone, NULL AS crash_streak, NULL AS quarantine_after, NULL AS freed_at,
       NULL AS task, NULL AS args, NULL AS run_at, NULL AS starts_at, NULL AS ends_at,
       NULL AS jitter, NULL AS max_runs, NULL AS runs_started, NULL AS overlap,
       NULL AS backfill_next, NULL AS backfill_to
FROM taken AS t
UNION ALL
SELECT d.job_key, NULL, NULL, NULL, d.cron, d.every, d.timezone,
       d.ttl, d.misfire, d.misfire_grace, d.on_crash, d.revision, d.next_slot, d.done_slot,
       d.running_slot, d.running_kind, d.running_token, d.running_attempt, d.trigger_at,
       c.now, NULL::timestamptz AS ready_at, d.prior_gone, d.crash_streak, d.quarantine_after,
       d.freed_at, d.task, d.args, d.run_at, d.starts_at, d.ends_at, d.jitter, d.max_runs,
       d.runs_started, d.overlap, d.backfill_next, d.backfill_to
FROM due AS d
CROSS JOIN clock AS c
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, r.now, r.ready_at, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM ready AS r;

-- name: sched_start
-- Record what the claiming worker decided for each claimed job (its plan, computed in Python
-- from the claim's rows and database time): the slot it runs now (if any), the new next
-- slot (only forward, and only if the definition revision is unchanged), the slots it
-- skipped (misfire_skipped / abandoned rows) and the run on the job row (running_*; its
-- history row is written at its end, by sched_finish, or after a second by sched_running:
-- migration 12). Fenced on claim_token, evaluated on the latest row version: a worker whose
-- claim was superseded changes nothing. A previous run that never finished is recorded as
-- lease_lost, from what its job row says of it (read before this statement's update). Jobs with
-- nothing to run get their lease released in the same statement. crash_streak is the plan's
-- (computed from the claimed row, which only fenced statements change); a plan with a
-- quarantine reason pauses the job with it.
--
-- A plan with `take` is the next run of a job its worker kept (sched_finish): the finish
-- released the job's lease, so this start takes it over as a claim would, in the same
-- statement: only after that lease's expiry and only from the token the plan names (the
-- released one: nobody took the job since), a fresh owner (the plan's), token + 1 (at least
-- the floor), job_state.token and claim_token moved, the fence row locked first with SKIP
-- LOCKED (a fenced transaction still open on it leaves the job to a later claim). `reserve`:
-- this worker expects to keep the job after this run too, so the run's job row is due only
-- %(reserve)s seconds after its next slot (where the finish would put it: its update stays
-- heap-only). One row back per job whose start was recorded; for a taken lease its token and
-- expiry.
WITH plan AS (
    -- One JSON array of objects for the batch: psycopg dumps a str in C, where 14 typed
    -- array parameters were dumped element by element in Python (a fifth of the worker's
    -- CPU, see bench/README.md).
    SELECT *
    FROM json_to_recordset(%(plan)s::json)
        AS p(job_key text, token bigint, owner uuid, revision integer, run_slot timestamptz,
             run_kind text, attempt integer, next_slot timestamptz, done_slot timestamptz,
             trigger_at timestamptz, prior_token bigint, prior_error text,
             crash_streak integer, quarantine text, backfill_from timestamptz,
             backfill_next timestamptz, take boolean, reserve boolean)
    -- Not a limit (%(count)s is the array's length) but the planner's row estimate: it
    -- plans this statement for each call (tenure.leases PLANNED_EACH_CALL) and, told 100 rows
    -- (its guess for any set-returning function), joined a batch of 5 by reading every row
    -- of scheduled_jobs, job_leases and job_runs instead of looking each up by its index.
    LIMIT %(count)s
), fence AS MATERIALIZED (
    -- The fence rows of the plans that take a lease, locked in key order, each found by its
    -- key (an index probe per plan: a hash join read all of job_state on every start).
    SELECT s.job_key
    FROM (SELECT job_key FROM plan WHERE take AND run_slot IS NOT NULL ORDER BY job_key) AS p
    CROSS JOIN LATERAL (
        SELECT s.job_key FROM {schema}.job_state AS s
        WHERE s.job_key = p.job_key
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS s
), pc AS MATERIALIZED (
    -- Each plan, with the token of the lease it takes over (NULL: none, or it may not), the
    -- lease looked up by its key. One row per plan (a CTE of taken plans joined to the plans
    -- made a nested loop: n * n).
    SELECT p.*,
           CASE WHEN p.take AND p.run_slot IS NOT NULL
                     AND p.job_key IN (SELECT job_key FROM fence)
                THEN (SELECT greatest(l.fencing_token + 1, {token_floor})
                      FROM {schema}.job_leases AS l
                      WHERE l.job_key = p.job_key AND l.fencing_token = p.token
                        AND l.lease_until < clock_timestamp()) END AS taken_token
    FROM plan AS p
    LIMIT %(count)s  -- the planner's row estimate, as above
), job AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET crash_streak = p.crash_streak,
        paused = j.paused OR p.quarantine IS NOT NULL,
        paused_at = CASE WHEN p.quarantine IS NOT NULL AND NOT j.paused
                         THEN clock_timestamp() ELSE j.paused_at END,
        quarantined_at = CASE WHEN p.quarantine IS NOT NULL
                              THEN clock_timestamp() ELSE j.quarantined_at END,
        quarantine_reason = coalesce(p.quarantine, j.quarantine_reason),
        next_slot = CASE WHEN j.revision = p.revision
                         THEN greatest(j.next_slot, p.next_slot) ELSE j.next_slot END,
        done_slot = greatest(j.done_slot, p.done_slot),
        running_slot = p.run_slot,
        running_kind = p.run_kind,
        running_token = CASE WHEN p.run_slot IS NULL THEN NULL
                             ELSE coalesce(p.taken_token, p.token) END,
        claim_token = coalesce(p.taken_token, j.claim_token),
        claimed_at = CASE WHEN p.taken_token IS NULL THEN j.claimed_at
                          ELSE clock_timestamp() END,
        running_attempt = CASE WHEN p.run_slot IS NULL THEN NULL ELSE p.attempt END,
        running_owner = CASE WHEN p.run_slot IS NULL THEN NULL ELSE p.owner END,
        running_started_at = CASE WHEN p.run_slot IS NULL THEN NULL ELSE clock_timestamp() END,
        running_worker = CASE WHEN p.run_slot IS NULL THEN NULL ELSE %(worker)s END,
        running_host = CASE WHEN p.run_slot IS NULL THEN NULL ELSE %(host)s END,
        running_pid = CASE WHEN p.run_slot IS NULL THEN NULL ELSE %(pid)s::integer END,
        -- Due again at the next slot (plus the reserve, kept), or when a dead worker's lease
        -- would have expired (migration 11); nothing to run: due at the next slot.
        held_until = CASE WHEN p.run_slot IS NOT NULL THEN least(
            CASE WHEN j.revision = p.revision
                 THEN greatest(j.next_slot, p.next_slot) ELSE j.next_slot END
                + CASE WHEN p.reserve THEN make_interval(secs => %(reserve)s)
                       ELSE interval '0' END,
            clock_timestamp() + j.ttl) END,
        trigger_at = CASE WHEN j.trigger_at = p.trigger_at THEN NULL ELSE j.trigger_at END,
        runs_started = j.runs_started + CASE WHEN p.run_kind = 'scheduled' THEN 1 ELSE 0 END,
        backfill_next = CASE WHEN j.backfill_next = p.backfill_from THEN p.backfill_next
                             ELSE j.backfill_next END,
        backfill_to = CASE WHEN j.backfill_next = p.backfill_from AND p.backfill_next IS NULL
                           THEN NULL ELSE j.backfill_to END
    FROM pc AS p
    -- The definition the claim planned with is still the job's (a change of a runtime
    -- schedule, a re-registration, bumps the revision) and the job was not paused or
    -- removed meanwhile: a run never starts under an older definition than the newest
    -- committed one (invariant 8). A refused start's lease is released below. A plan that
    -- takes its lease: only if it may (the job row is locked here before the lease row, as
    -- a claim locks them).
    WHERE j.job_key = p.job_key AND j.claim_token = p.token AND j.revision = p.revision
      AND NOT j.paused
      AND (p.take IS NOT TRUE OR p.run_slot IS NULL OR p.taken_token IS NOT NULL)
    RETURNING j.job_key, j.running_started_at, p.taken_token, p.token, p.owner, j.ttl
), taken AS (
    UPDATE {schema}.job_leases AS l
    SET lease_owner = job.owner, fencing_token = job.taken_token,
        lease_until = clock_timestamp() + job.ttl, lease_ttl = job.ttl,
        acquired_at = clock_timestamp(), renewed_at = clock_timestamp()
    FROM job
    WHERE job.taken_token IS NOT NULL
      AND l.job_key = job.job_key AND l.fencing_token = job.token
      AND l.lease_until < clock_timestamp()
    RETURNING l.job_key, job.running_started_at, l.fencing_token, l.lease_until
), state AS (
    UPDATE {schema}.job_state AS s
    SET token = t.fencing_token
    FROM taken AS t
    WHERE s.job_key = t.job_key
), prior AS (
    -- The job row as it was before this statement (a CTE reads the statement's snapshot).
    -- A finished run has its row already (not 'running'): left as it is. A run of a worker
    -- before migration 12 has no running_worker; its row was written at its start.
    INSERT INTO {schema}.job_runs AS r
        (job_key, slot, kind, attempt, token, owner, worker_id, host, pid, started_at,
         finished_at, outcome, error, recorded_at)
    SELECT o.job_key, o.running_slot, coalesce(o.running_kind, 'scheduled'),
           coalesce(o.running_attempt, 1), o.running_token, o.running_owner,
           coalesce(o.running_worker, ''), coalesce(o.running_host, ''),
           coalesce(o.running_pid, 0), coalesce(o.running_started_at, clock_timestamp()),
           clock_timestamp(), 'lease_lost', p.prior_error,
           coalesce(o.running_started_at, clock_timestamp())
    FROM plan AS p
    JOIN {schema}.scheduled_jobs AS o
      ON o.job_key = p.job_key AND o.running_token = p.prior_token
    WHERE p.job_key IN (SELECT job_key FROM job) AND o.running_slot IS NOT NULL
    ORDER BY o.job_key
    ON CONFLICT (job_key, token) WHERE started_at IS NOT NULL DO UPDATE
    SET outcome = 'lease_lost', finished_at = excluded.finished_at, error = excluded.error
    WHERE r.outcome = 'running'
    RETURNING r.job_key
), skipped AS (
    -- A run of missed slots is one row: slots (its count) from slot to last_slot (version 13).
    INSERT INTO {schema}.job_runs
        (job_key, slot, kind, token, worker_id, host, pid, finished_at, outcome, error, slots,
         last_slot)
    -- (A taken lease's start records them under the token it took.)
    SELECT s.job_key, s.slot, s.kind, coalesce(t.fencing_token, s.token), %(worker)s, %(host)s,
           %(pid)s, clock_timestamp(), s.outcome, s.error, coalesce(s.slots, 1), s.last_slot
    FROM json_to_recordset(%(skipped)s::json)
        AS s(job_key text, slot timestamptz, token bigint, kind text, outcome text, error text,
             slots integer, last_slot timestamptz)
    LEFT JOIN taken AS t ON t.job_key = s.job_key
    WHERE s.job_key IN (SELECT job_key FROM job)
      -- After the previous run's row (read to the end first): history in the order it
      -- happened (an unreferenced CTE runs at an order of the planner's choosing).
      AND (SELECT count(*) FROM prior) >= 0
), idle AS (
    -- Nothing to run, or the start was refused (the job changed, paused or gone): release.
    UPDATE {schema}.job_leases AS l
    SET lease_until = clock_timestamp()
    FROM plan AS p
    WHERE (p.run_slot IS NULL OR p.job_key NOT IN (SELECT job_key FROM job))
      AND p.take IS NOT TRUE
      AND l.job_key = p.job_key AND l.fencing_token = p.token AND l.lease_owner = p.owner
      AND l.lease_until >= clock_timestamp()
)
-- One row per job whose start was recorded, with the run's start time (NULL: nothing to run)
-- and, for a lease taken over here, its token and expiry. (Two branches, not a join of the
-- two CTEs: see pc.)
SELECT job.job_key, job.running_started_at AS started_at, NULL::bigint AS token,
       NULL::timestamptz AS lease_until
FROM job
WHERE job.taken_token IS NULL
UNION ALL
SELECT t.job_key, t.running_started_at, t.fencing_token, t.lease_until
FROM taken AS t;

-- name: sched_unclaim
-- Give back leases this worker claimed but cannot run (a job it has no function for): the
-- lease expires now and the job is due again as before the claim, so a worker that has the
-- job takes it at once.
WITH u AS MATERIALIZED (
    SELECT * FROM unnest(%(keys)s::text[], %(tokens)s::bigint[], %(owners)s::uuid[])
        AS u(job_key, token, owner)
), job AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET held_until = NULL
    FROM u
    WHERE j.job_key = u.job_key AND j.claim_token = u.token
)
UPDATE {schema}.job_leases AS l
SET lease_until = clock_timestamp()
FROM u
WHERE l.job_key = u.job_key AND l.fencing_token = u.token AND l.lease_owner = u.owner
  AND l.lease_until >= clock_timestamp()
RETURNING l.job_key;

-- name: sched_finish
-- End a batch of runs and release their leases, in one statement (the worker's finisher
-- sends whatever finished while its previous batch was in flight). Per run: done (the run
-- succeeded or failed with its lease intact): running_slot is cleared and done_slot moves
-- forward, so the slot never runs again. Not done (lease lost, cancelled at shutdown):
-- running_slot stays, the lease is released and peers are notified, so another worker
-- retries the slot at once with a higher token. Fenced on claim_token: a worker whose claim
-- was taken over cannot clear its successor's slot; its own history row still gets its
-- outcome, with a run that "succeeded" after losing its job recorded as lease_lost. The
-- history row is written here, once (migration 12): inserted, or completed where it is
-- already there (a long run's 'running' row, or the lease_lost row of a successor that took
-- the job over meanwhile: the run's own end is what it records), except a row an operator
-- wrote when cancelling the run (sched_cancel), which stands, and a row this run's own
-- earlier attempt at this statement wrote (%(retry)s: sent again after its answer was lost).
--
-- Kept jobs (docs/safety.md, "A job kept for its next slot"): a done run sent with `keep`
-- (its worker has room for the job's next run) whose job's next slot comes within
-- %(keep_ahead)s seconds, with nothing else pending (not paused, no trigger or backfill),
-- keeps its job: the lease is released as for any run, and the job is not due until
-- %(reserve)s seconds after that slot (held_until), so other workers' claims leave it to this
-- worker, whose start of that slot takes the lease over (sched_start's `take`). For those
-- runs a second row comes back with the job's columns as sched_claim returns them (token
-- NULL; fencing_token: the released lease's token, which that start must find). A done run
-- whose job could have been kept and was not is let go with a notification: its job was due
-- only after the reserve (its start expected to keep it), and every worker's claim loop must
-- look again to claim it at its slot.
WITH f AS MATERIALIZED (
    SELECT *
    FROM json_to_recordset(%(runs)s::json)
        AS f(job_key text, token bigint, owner uuid, slot timestamptz, kind text,
             attempt integer, started_at timestamptz, done boolean, outcome text, error text,
             keep boolean)
    LIMIT %(count)s  -- the planner's row estimate, see sched_start
), job AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET running_slot = CASE WHEN f.done THEN NULL ELSE j.running_slot END,
        running_kind = CASE WHEN f.done THEN NULL ELSE j.running_kind END,
        running_token = CASE WHEN f.done THEN NULL ELSE j.running_token END,
        running_attempt = CASE WHEN f.done THEN NULL ELSE j.running_attempt END,
        -- Done: due at the next slot, where the start already put it (no index entry moves).
        -- Not done: due at once (running_slot stays). Kept: not due until the reserve after
        -- the next slot (a start that expected to be kept put it there already).
        held_until = CASE
            WHEN f.keep AND f.done AND NOT j.paused AND j.trigger_at IS NULL
                 AND j.backfill_next IS NULL
                 AND j.next_slot <= clock_timestamp() + make_interval(secs => %(keep_ahead)s)
            THEN greatest(j.held_until, j.next_slot + make_interval(secs => %(reserve)s))
            END,
        done_slot = CASE WHEN f.done AND f.kind NOT IN ('manual', 'backfill')
                         THEN greatest(j.done_slot, f.slot) ELSE j.done_slot END,
        -- This run recorded its end: its worker was not gone (unless it is one that did not
        -- stop at its worker's shutdown: the next claim counts it as a crash).
        crash_streak = CASE WHEN f.outcome = 'abandoned' THEN j.crash_streak ELSE 0 END
    FROM f
    WHERE j.job_key = f.job_key AND j.claim_token = f.token AND j.running_token = f.token
    RETURNING j.job_key, f.token, j.held_until IS NOT NULL AS kept,
              j.held_until IS NULL AND f.done
                  AND j.next_slot <= clock_timestamp() + make_interval(secs => %(keep_ahead)s)
                  AS let_go,
              j.due_at, j.cron, j.every,
              j.timezone, j.ttl, j.misfire, j.misfire_grace, j.on_crash, j.revision,
              j.next_slot, j.done_slot, j.trigger_at, j.crash_streak, j.quarantine_after,
              j.task, j.args, j.run_at, j.starts_at, j.ends_at, j.jitter, j.max_runs,
              j.runs_started, j.overlap, j.backfill_next, j.backfill_to
), released AS (
    UPDATE {schema}.job_leases AS l
    SET lease_until = clock_timestamp()
    FROM f
    WHERE l.job_key = f.job_key AND l.lease_owner = f.owner AND l.fencing_token = f.token
      AND l.lease_until >= clock_timestamp()
    RETURNING l.job_key
), m AS (
    -- Each run's fence match, stated once for its history row and for the answer; a run
    -- keeps its own outcome if the fence held or it did not claim success or failure.
    -- A removed runtime schedule's run (no job row) was not taken over: it keeps its own.
    -- Sent again after its answer was lost, a run whose job nobody claimed since (its end
    -- cleared running_token) matched the first time.
    SELECT f.*, f.matched OR f.outcome NOT IN ('succeeded', 'failed')
                OR NOT EXISTS (SELECT 1 FROM {schema}.scheduled_jobs AS s
                               WHERE s.job_key = f.job_key) AS own
    FROM (SELECT f.*, f.job_key IN (SELECT job_key FROM job WHERE let_go) AS let_go,
                 (f.job_key, f.token) IN (SELECT job_key, token FROM job)
                      OR (%(retry)s::boolean AND EXISTS (
                          SELECT 1 FROM {schema}.scheduled_jobs AS s
                          WHERE s.job_key = f.job_key AND s.claim_token = f.token
                            AND s.running_token IS NULL)) AS matched
          FROM f) AS f
), run AS (
    INSERT INTO {schema}.job_runs AS r
        (job_key, slot, kind, attempt, token, owner, worker_id, host, pid, started_at,
         finished_at, outcome, error, recorded_at)
    SELECT m.job_key, m.slot, m.kind, m.attempt, m.token, m.owner, %(worker)s, %(host)s,
           %(pid)s, m.started_at, clock_timestamp(),
           CASE WHEN m.own THEN m.outcome ELSE 'lease_lost' END,
           CASE WHEN m.own THEN m.error
                ELSE concat_ws('; ', m.error, 'the run ended after another worker took the '
                                             'job over (its writes with this token are fenced)')
                END,
           -- When the run started, as for a row written at the start (the dashboard's
           -- windows and retention read recorded_at).
           m.started_at
    FROM m
    ORDER BY m.job_key, m.token
    ON CONFLICT (job_key, token) WHERE started_at IS NOT NULL DO UPDATE
    SET outcome = excluded.outcome, error = excluded.error, finished_at = excluded.finished_at
    -- A run an operator cancelled (sched_cancel) keeps that row: it says why it ended. A
    -- succeeded or failed row is only ever the run's own end (this statement, fence held):
    -- an attempt of it sent again after its answer was lost does not overwrite it.
    WHERE r.outcome NOT IN ('cancelled', 'succeeded', 'failed')
    RETURNING r.job_key, r.token, r.outcome
)
SELECT m.job_key, m.token, m.matched,
       coalesce(run.outcome,
                (SELECT r.outcome FROM {schema}.job_runs AS r
                 WHERE r.job_key = m.job_key AND r.token = m.token
                   AND r.started_at IS NOT NULL)) AS outcome,
       -- Read only for a run whose fence failed (for its log line).
       CASE WHEN NOT m.matched
            THEN (SELECT s.claim_token FROM {schema}.scheduled_jobs AS s
                  WHERE s.job_key = m.job_key) END AS current,
       -- A slot handed over, or a job that could have been kept let go (its worker has more
       -- than its share, or no room): every worker's claim loop looks again, so that the
       -- one whose claim comes first at the slot takes it (one notification per statement:
       -- PostgreSQL folds identical ones).
       CASE WHEN NOT m.done THEN pg_notify(%(channel)s, m.job_key)::text
            WHEN m.let_go THEN pg_notify(%(channel)s, 'let go')::text END AS notified,
       NULL::uuid AS lease_owner, NULL::bigint AS fencing_token, NULL::timestamptz AS lease_until,
       NULL::text AS cron, NULL::interval AS every, NULL::text AS timezone,
       NULL::interval AS ttl, NULL::text AS misfire, NULL::interval AS misfire_grace,
       NULL::text AS on_crash, NULL::integer AS revision, NULL::timestamptz AS next_slot,
       NULL::timestamptz AS done_slot, NULL::timestamptz AS running_slot,
       NULL::text AS running_kind, NULL::bigint AS running_token,
       NULL::integer AS running_attempt, NULL::timestamptz AS trigger_at,
       -- When the claim loop should look again for the jobs this batch did not keep: the
       -- earliest that one of them is due (now, for a retry, a trigger or a backfill slot),
       -- so that a worker's claims do not wait for a run's end to wake them.
       clock_timestamp() AS now,
       greatest((SELECT min(k.due_at) FROM job AS k WHERE NOT k.kept), clock_timestamp())
           AS ready_at,
       NULL::boolean AS prior_gone,
       NULL::integer AS crash_streak, NULL::integer AS quarantine_after,
       NULL::timestamptz AS freed_at, NULL::text AS task, NULL::jsonb AS args,
       NULL::timestamptz AS run_at, NULL::timestamptz AS starts_at,
       NULL::timestamptz AS ends_at, NULL::interval AS jitter, NULL::integer AS max_runs,
       NULL::integer AS runs_started, NULL::text AS overlap,
       NULL::timestamptz AS backfill_next, NULL::timestamptz AS backfill_to
FROM m
LEFT JOIN run ON run.job_key = m.job_key AND run.token = m.token
UNION ALL
-- The kept jobs, as sched_claim returns a job it claimed: the lease's columns are the
-- released lease's token (owner and expiry NULL: the start takes it over), nothing running
-- (prior_gone false), freed_at NULL (the lease before it was this worker's own).
SELECT k.job_key, NULL, NULL, NULL, NULL, NULL, NULL, k.token, NULL, k.cron, k.every,
       k.timezone, k.ttl, k.misfire, k.misfire_grace, k.on_crash, k.revision, k.next_slot,
       k.done_slot, NULL, NULL, NULL, NULL, k.trigger_at, clock_timestamp(), NULL, false,
       k.crash_streak, k.quarantine_after, NULL, k.task, k.args, k.run_at, k.starts_at,
       k.ends_at, k.jitter, k.max_runs, k.runs_started, k.overlap, k.backfill_next,
       k.backfill_to
FROM job AS k
WHERE k.kept;

-- name: sched_running
-- The history rows of runs still in progress a while after their start (the worker sends
-- the runs that outlived sched_finish's usual moment, see scheduler.worker.RUNNING_ROW_AFTER),
-- so that history and the dashboard show them: outcome 'running', completed by the finish.
-- Nothing is written where the row is there already (the run ended, or a successor recorded
-- it as lease_lost), nor for a run that is no longer its job's (the fence: running_token).
INSERT INTO {schema}.job_runs
    (job_key, slot, kind, attempt, token, owner, worker_id, host, pid, started_at, outcome,
     recorded_at)
SELECT r.job_key, r.slot, r.kind, r.attempt, r.token, r.owner, %(worker)s, %(host)s, %(pid)s,
       r.started_at, 'running', r.started_at
FROM json_to_recordset(%(runs)s::json)
    AS r(job_key text, token bigint, owner uuid, slot timestamptz, kind text, attempt integer,
         started_at timestamptz)
JOIN {schema}.scheduled_jobs AS j ON j.job_key = r.job_key AND j.running_token = r.token
ORDER BY r.job_key, r.token
ON CONFLICT (job_key, token) WHERE started_at IS NOT NULL DO NOTHING
RETURNING job_key;

-- name: sched_vacuum_due
-- Whether the scheduler's hot tables want a vacuum now (scheduler/vacuum.py says why the
-- workers do it): one of them has gathered at least %(min_dead)s dead rows and none of them
-- was vacuumed, by hand or by autovacuum, in the last %(every)s. And whether this role may
-- vacuum them: their owner, the database's owner (both through membership) and a superuser
-- may; from PostgreSQL 17 so may a role with MAINTAIN. A role that may not would only get a
-- WARNING per table from VACUUM, never an error. `tables`: how many of the three exist
-- (tenure doctor; 0 before migration).
SELECT coalesce(bool_or(t.n_dead_tup >= %(min_dead)s), false)
           AND coalesce(bool_and(coalesce(greatest(t.last_vacuum, t.last_autovacuum),
                                          '-infinity') < clock_timestamp() - %(every)s),
                        false) AS due,
       coalesce(bool_and(
           pg_has_role(c.relowner, 'USAGE')
           OR pg_has_role((SELECT d.datdba FROM pg_database AS d
                           WHERE d.datname = current_database()), 'USAGE')
           OR CASE WHEN current_setting('server_version_num')::integer >= 170000
                   THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END),
           false) AS permitted,
       count(*) AS tables
FROM pg_stat_user_tables AS t
JOIN pg_class AS c ON c.oid = t.relid
WHERE t.schemaname = %(schema)s
  AND t.relname IN ('scheduled_jobs', 'job_leases', 'job_state');

-- name: sched_vacuum
-- SKIP_LOCKED: a table another worker (or autovacuum) is vacuuming right now is skipped, not
-- waited for. VACUUM takes SHARE UPDATE EXCLUSIVE, which no claim, start or finish conflicts
-- with; it runs on an autocommit connection of the pool, as it must (never in a transaction).
VACUUM (SKIP_LOCKED) {schema}.scheduled_jobs, {schema}.job_leases, {schema}.job_state;

-- name: sched_notify
SELECT pg_notify(%(channel)s, %(payload)s)::text;

-- name: sched_prune
-- Retention: delete finished history rows older than the retention, a bounded batch at a time
-- (the worker repeats it until a batch comes back short). SKIP LOCKED: two workers pruning at
-- once take different rows instead of waiting for each other.
WITH gone AS (
    DELETE FROM {schema}.job_runs
    WHERE run_id IN (
        SELECT run_id FROM {schema}.job_runs
        WHERE recorded_at < clock_timestamp() - %(retention)s::interval
          AND outcome <> 'running'
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: sched_list
-- Each job's last row that is not a run still going, as it was by run_id (the order rows are
-- written in; migration 19 dropped its index): the newest by recorded_at (a run's start,
-- job_runs_window backwards), but where a start skipped slots. It records them microseconds
-- after the run it starts, whose row is written when that run ends: that run is what the
-- job did last, so a newest row that never started gives way to the ended run of its claim
-- (the same token, job_runs_run). LIMIT 1 keeps that lookup a subquery, run only for such a
-- row.
SELECT j.job_key, j.cron, j.every, j.timezone, j.ttl, j.misfire, j.misfire_grace, j.on_crash,
       j.revision, j.defined_at, j.defined_by, j.paused, j.next_slot, j.running_slot,
       j.running_token, j.trigger_at, l.fencing_token, l.lease_until,
       coalesce(l.lease_until >= clock_timestamp(), false) AS held,
       last.outcome, last.slot, last.finished_at, clock_timestamp() AS now,
       j.quarantine_after, j.crash_streak, j.quarantined_at, j.quarantine_reason, j.app,
       j.task, j.run_at, j.starts_at, j.ends_at, j.jitter
FROM {schema}.scheduled_jobs AS j
LEFT JOIN {schema}.job_leases AS l ON l.job_key = j.job_key
LEFT JOIN LATERAL (
    SELECT coalesce(own.outcome, top.outcome) AS outcome, coalesce(own.slot, top.slot) AS slot,
           CASE WHEN own.outcome IS NULL THEN top.finished_at ELSE own.finished_at END
               AS finished_at
    FROM (
        SELECT r.outcome, r.slot, r.finished_at, r.token, r.started_at
        FROM {schema}.job_runs AS r
        WHERE r.job_key = j.job_key AND r.outcome <> 'running'
        ORDER BY r.recorded_at DESC
        LIMIT 1
    ) AS top
    LEFT JOIN LATERAL (
        SELECT o.outcome, o.slot, o.finished_at
        FROM {schema}.job_runs AS o
        WHERE top.started_at IS NULL AND o.job_key = j.job_key AND o.token = top.token
          AND o.started_at IS NOT NULL AND o.outcome <> 'running'
        LIMIT 1
    ) AS own ON true
) AS last ON true
ORDER BY j.job_key;

-- name: sched_get
SELECT job_key, cron, every, timezone, revision, paused, next_slot, trigger_at,
       clock_timestamp() AS now, quarantine_reason, run_at, starts_at, ends_at, jitter
FROM {schema}.scheduled_jobs
WHERE job_key = %(job_key)s;

-- name: sched_pause
WITH old AS MATERIALIZED (
    SELECT job_key, paused FROM {schema}.scheduled_jobs WHERE job_key = %(job_key)s
), changed AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET paused = true, paused_at = clock_timestamp()
    WHERE j.job_key = %(job_key)s AND NOT j.paused
    RETURNING j.job_key
)
SELECT o.paused AS was_paused, (SELECT count(*) FROM changed) AS changed,
       pg_notify(%(channel)s, 'paused')::text AS notified
FROM old AS o;

-- name: sched_resume
-- Resume from now on: %(next_slot)s is the first slot after the database's now, computed by
-- the caller from revision %(revision)s; slots that passed while paused are not run.
-- Resuming lifts a quarantine too, and the job's streak of runs whose worker was gone
-- starts again from zero.
WITH changed AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET paused = false, paused_at = NULL, next_slot = greatest(j.next_slot, %(next_slot)s),
        quarantined_at = NULL, quarantine_reason = NULL, crash_streak = 0
    WHERE j.job_key = %(job_key)s AND j.paused AND j.revision = %(revision)s
    RETURNING j.next_slot
)
SELECT next_slot, pg_notify(%(channel)s, 'resumed')::text AS notified FROM changed;

-- name: sched_trigger
-- Run now, once: a pending trigger is kept (two triggers before the run make one run).
WITH old AS MATERIALIZED (
    SELECT job_key, trigger_at, paused FROM {schema}.scheduled_jobs
    WHERE job_key = %(job_key)s
), changed AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET trigger_at = clock_timestamp()
    WHERE j.job_key = %(job_key)s AND j.trigger_at IS NULL
    RETURNING j.trigger_at
)
SELECT o.trigger_at AS pending, (SELECT trigger_at FROM changed) AS triggered, o.paused,
       pg_notify(%(channel)s, 'triggered')::text AS notified
FROM old AS o;

-- name: sched_cancel
-- An operator cancels the run in progress with %(token)s (the dashboard's Cancel): the run's
-- lease ends now (its holder's renewal fails, so its body is told to stop as on any lost
-- lease, and the strict fence refuses its writes from now on), the run is recorded as
-- cancelled with %(error)s, and its slot counts as done (a scheduled slot is not retried: the
-- operator ended it; the job runs again at its next slot or trigger, by any worker, with a
-- higher token). Only while the run is its job's newest claim (claim_token and the lease's
-- token are still the run's: no successor took the job over; a claim skips the job row this
-- statement locks). The holder's later sched_finish matches nothing (running_token is
-- cleared) and keeps this row's outcome. A run whose worker is gone (its lease expired,
-- nobody claimed the job yet) is cancelled the same way. One row back, always.
WITH job AS MATERIALIZED (
    SELECT j.job_key, j.running_slot, j.running_kind, j.running_attempt, j.running_token,
           j.running_owner, j.running_worker, j.running_host, j.running_pid,
           j.running_started_at
    FROM {schema}.scheduled_jobs AS j
    JOIN {schema}.job_leases AS l ON l.job_key = j.job_key
    WHERE j.job_key = %(job_key)s AND j.running_slot IS NOT NULL
      AND j.running_token = %(token)s AND j.claim_token = %(token)s
      AND l.fencing_token = %(token)s
    FOR UPDATE OF j
), ended AS (
    UPDATE {schema}.job_leases AS l
    SET lease_until = clock_timestamp()
    FROM job
    WHERE l.job_key = job.job_key AND l.fencing_token = job.running_token
      AND l.lease_until >= clock_timestamp()
    RETURNING l.job_key
), cleared AS (
    UPDATE {schema}.scheduled_jobs AS j
    SET running_slot = NULL, running_kind = NULL, running_token = NULL,
        running_attempt = NULL, held_until = NULL, crash_streak = 0,
        done_slot = CASE WHEN job.running_kind NOT IN ('manual', 'backfill')
                         THEN greatest(j.done_slot, job.running_slot) ELSE j.done_slot END
    FROM job
    WHERE j.job_key = job.job_key
    RETURNING j.job_key
), run AS (
    INSERT INTO {schema}.job_runs AS r
        (job_key, slot, kind, attempt, token, owner, worker_id, host, pid, started_at,
         finished_at, outcome, error, recorded_at)
    SELECT job.job_key, job.running_slot, coalesce(job.running_kind, 'scheduled'),
           coalesce(job.running_attempt, 1), job.running_token, job.running_owner,
           coalesce(job.running_worker, ''), coalesce(job.running_host, ''),
           coalesce(job.running_pid, 0), coalesce(job.running_started_at, clock_timestamp()),
           clock_timestamp(), 'cancelled', %(error)s,
           coalesce(job.running_started_at, clock_timestamp())
    FROM job
    ON CONFLICT (job_key, token) WHERE started_at IS NOT NULL DO UPDATE
    SET outcome = 'cancelled', finished_at = excluded.finished_at, error = excluded.error
    WHERE r.outcome = 'running'
    RETURNING r.job_key
)
SELECT (SELECT count(*) FROM cleared) > 0 AS cancelled,
       (SELECT count(*) FROM ended) > 0 AS lease_ended,
       (SELECT running_token FROM {schema}.scheduled_jobs
        WHERE job_key = %(job_key)s) AS running_token,
       (SELECT count(*) FROM run) AS recorded,
       EXISTS (SELECT 1 FROM {schema}.scheduled_jobs WHERE job_key = %(job_key)s) AS known;

-- name: sched_history
-- A job's newest rows, newest first in the order they were written (run_id), read as its
-- newest by recorded_at (job_runs_window; migration 19 dropped the (job_key, run_id) index).
-- tenure writes a job's rows in both orders alike but within one start statement: the slots
-- it skips (at most four rows: an abandoned slot, two runs of missed slots, a max_runs
-- refusal) are recorded microseconds after the run it starts, whose row is written when that
-- run ends. So four rows more than asked hold the newest by run_id.
SELECT run_id, job_key, slot, kind, attempt, token, owner, worker_id, host, pid, started_at,
       finished_at, outcome, error, slots, last_slot
FROM (
    SELECT *
    FROM {schema}.job_runs
    WHERE job_key = %(job_key)s
    ORDER BY recorded_at DESC
    LIMIT %(limit)s + 4
) AS newest
ORDER BY run_id DESC
LIMIT %(limit)s;

-- name: sched_presence_enter
-- A worker that starts says which job keys its code defines (scheduler/presence.py), until
-- %(ttl)s from now; its beats push seen_until forward. Rows of workers that died long ago are
-- removed here, so the table stays as small as the fleet.
WITH gone AS (
    DELETE FROM {schema}.scheduler_workers
    WHERE seen_until < clock_timestamp() - interval '1 day' AND worker_id <> %(worker)s
)
INSERT INTO {schema}.scheduler_workers (worker_id, app, job_keys, host, pid, seen_until)
VALUES (%(worker)s, %(app)s, %(keys)s::text[], %(host)s, %(pid)s, clock_timestamp() + %(ttl)s)
ON CONFLICT (worker_id) DO UPDATE
SET app = excluded.app, job_keys = excluded.job_keys, seen_until = excluded.seen_until;

-- name: sched_presence_beat
-- A worker's beat (scheduler/presence.py). Rows back, by kind (n: a count, of the last two):
--   'me': its row was there (seen_until moved %(ttl)s ahead, its loop lag since the last
--     beat and its saturation written for the dashboard, migration 17; job_keys is not
--     rewritten);
--   'excluded': a coded job of its app (or of none yet) that its code does not define (not a
--     runtime schedule, task set: its task decides, docs/schedules.md): its claims
--     leave it out, so it takes no token for a job it cannot run;
--   'lost': the unfinished run of a job of its app that no live worker of the app defines,
--     recorded now as lease_lost: its lease has expired with no finish record (its worker
--     is gone) and nobody will claim the job to record it as the next start would. Fenced
--     on the run's own token (the lease still has it: nobody claimed the job since); a
--     worker that was only frozen and then finishes the run records its own outcome over it.
WITH me AS (
    UPDATE {schema}.scheduler_workers
    SET seen_until = clock_timestamp() + %(ttl)s, loop_lag = %(loop_lag)s,
        saturated = %(saturated)s
    WHERE worker_id = %(worker)s
    RETURNING job_keys
), mine AS MATERIALIZED (
    SELECT k.job_key FROM me, unnest(me.job_keys) AS k(job_key)
), live AS MATERIALIZED (
    -- The keys the app's live workers define (this worker's own from its row as updated).
    SELECT k.job_key
    FROM {schema}.scheduler_workers AS w, unnest(w.job_keys) AS k(job_key)
    WHERE w.app = %(app)s AND w.seen_until >= clock_timestamp() AND w.worker_id <> %(worker)s
    UNION
    SELECT job_key FROM mine
), lost AS (
    INSERT INTO {schema}.job_runs AS r
        (job_key, slot, kind, attempt, token, owner, worker_id, host, pid, started_at,
         finished_at, outcome, error, recorded_at)
    SELECT j.job_key, j.running_slot, coalesce(j.running_kind, 'scheduled'),
           coalesce(j.running_attempt, 1), j.running_token, j.running_owner,
           coalesce(j.running_worker, ''), coalesce(j.running_host, ''),
           coalesce(j.running_pid, 0), coalesce(j.running_started_at, clock_timestamp()),
           clock_timestamp(), 'lease_lost',
           'the run ended with its worker gone, and no live worker of app ' || j.app
               || ' defines the job (removed from the code?); `tenure jobs remove` deletes it',
           coalesce(j.running_started_at, clock_timestamp())
    FROM {schema}.scheduled_jobs AS j
    JOIN {schema}.job_leases AS l ON l.job_key = j.job_key
    WHERE j.app = %(app)s AND j.task IS NULL AND j.running_slot IS NOT NULL
      AND EXISTS (SELECT 1 FROM me)
      AND NOT EXISTS (SELECT 1 FROM live WHERE live.job_key = j.job_key)
      AND l.fencing_token = j.running_token AND l.lease_until < clock_timestamp()
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.job_runs AS x
          WHERE x.job_key = j.job_key AND x.token = j.running_token
            AND x.started_at IS NOT NULL AND x.outcome <> 'running')
    ORDER BY j.job_key
    ON CONFLICT (job_key, token) WHERE started_at IS NOT NULL DO UPDATE
    SET outcome = excluded.outcome, finished_at = excluded.finished_at, error = excluded.error
    WHERE r.outcome = 'running'
    RETURNING r.job_key
)
SELECT 'me' AS kind, NULL AS job_key, NULL::bigint AS n FROM me
UNION ALL
SELECT 'excluded', j.job_key, NULL
FROM {schema}.scheduled_jobs AS j
WHERE (j.app = %(app)s OR j.app IS NULL) AND j.task IS NULL
  AND EXISTS (SELECT 1 FROM me)
  -- NOT IN: a hashed subplan of the worker's keys. NOT EXISTS over the CTE was a nested
  -- loop, every job against every key: 0.7 to 1.1 s of server time per beat at 4,000 jobs.
  AND j.job_key NOT IN (SELECT job_key FROM mine)
UNION ALL
SELECT 'lost', job_key, NULL FROM lost
UNION ALL
-- How many jobs each worker of the app keeps at most (scheduler/finisher.py, "kept jobs"):
-- its live workers, and its jobs whose slots come at most %(keep_ahead)s seconds apart.
SELECT 'workers', NULL, (SELECT count(*) FROM {schema}.scheduler_workers AS w
                         WHERE w.app = %(app)s AND w.seen_until >= clock_timestamp())
UNION ALL
-- Of them, the others that said at their last beat they were not saturated: a saturated
-- worker lets its jobs go only when one of them could take them.
SELECT 'spare', NULL, (SELECT count(*) FROM {schema}.scheduler_workers AS w
                       WHERE w.app = %(app)s AND w.seen_until >= clock_timestamp()
                         AND w.worker_id <> %(worker)s AND NOT coalesce(w.saturated, false))
UNION ALL
SELECT 'keepable', NULL, (SELECT count(*) FROM {schema}.scheduled_jobs AS j
                          WHERE j.app = %(app)s AND NOT j.paused
                            AND j.every <= make_interval(secs => %(keep_ahead)s));

-- name: sched_body_lengths
-- How long each of a starting worker's jobs ran lately (scheduler/bodies.py), so that it
-- knows its slow and quick jobs before running each once itself: the shortest of each job's
-- last three ended runs, from its recorded start to its recorded end, in seconds (a start is
-- recorded before the run's wait for a body slot: the shortest is the least inflated). One
-- backward step per job on job_runs_run; jobs that never ran return no row.
SELECT k.job_key, min(r.took) AS took
FROM unnest(%(keys)s::text[]) AS k(job_key)
CROSS JOIN LATERAL (
    SELECT extract(epoch FROM x.finished_at - x.started_at)::float8 AS took
    FROM {schema}.job_runs AS x
    WHERE x.job_key = k.job_key AND x.started_at IS NOT NULL
      AND x.outcome IN ('succeeded', 'failed') AND x.finished_at IS NOT NULL
    ORDER BY x.token DESC
    LIMIT 3
) AS r
GROUP BY k.job_key;

-- name: sched_presence_leave
-- A worker that stops takes its job keys off the list at once.
DELETE FROM {schema}.scheduler_workers WHERE worker_id = %(worker)s;

-- name: sched_undefined
-- The coded jobs that no worker defines: of an app that has a live worker, and none of its live
-- workers defines the key (removed from the code; scheduler/presence.py). A job of an app
-- whose workers are all down is not one of them: it is waiting for them. One hash join, not
-- a search of every worker's keys per job.
WITH live AS MATERIALIZED (
    SELECT w.app, k.job_key
    FROM {schema}.scheduler_workers AS w, unnest(w.job_keys) AS k(job_key)
    WHERE w.seen_until >= clock_timestamp()
)
SELECT j.job_key
FROM {schema}.scheduled_jobs AS j
WHERE j.task IS NULL AND j.app IN (SELECT app FROM live)
  AND NOT EXISTS (SELECT 1 FROM live WHERE live.app = j.app AND live.job_key = j.job_key)
ORDER BY j.job_key;

-- name: sched_remove_job
-- `tenure jobs remove KEY`: delete a coded job's definition (a runtime schedule, task set, is
-- removed by `tenure schedules remove`, which records the change), refused while a live worker of its
-- app defines it (it would register it again, or run it without a row) or while its lease is
-- live (a run already going finishes under its own token). The lease row (job_leases) and
-- job_state stay: if the key is defined again, its tokens continue above the old ones. Its
-- history stays until retention. Run under the registration's lock (one at a time per
-- schema, scheduler.registration): a worker writes its presence row before it registers,
-- so a registration that ran before this statement has its row visible here.
WITH job AS MATERIALIZED (
    SELECT j.job_key, j.app, j.task FROM {schema}.scheduled_jobs AS j
    WHERE j.job_key = %(job_key)s
    FOR UPDATE
), definers AS MATERIALIZED (
    SELECT w.worker_id, w.host, w.pid
    FROM {schema}.scheduler_workers AS w, job
    WHERE w.app = job.app AND w.seen_until >= clock_timestamp()
      AND job.job_key = ANY (w.job_keys)
), held AS MATERIALIZED (
    SELECT l.fencing_token, l.lease_until FROM {schema}.job_leases AS l
    WHERE l.job_key = %(job_key)s AND l.lease_until >= clock_timestamp()
), gone AS (
    DELETE FROM {schema}.scheduled_jobs AS j
    USING job
    WHERE j.job_key = job.job_key AND job.task IS NULL
      AND NOT EXISTS (SELECT 1 FROM definers) AND NOT EXISTS (SELECT 1 FROM held)
    RETURNING j.job_key
)
SELECT job.app,
       EXISTS (SELECT 1 FROM gone) AS removed,
       (SELECT string_agg(format('%%s (%%s pid %%s)', d.worker_id, d.host, d.pid), ', '
                          ORDER BY d.worker_id)
        FROM definers AS d) AS definers,
       (SELECT h.lease_until FROM held AS h) AS held_until,
       (SELECT l.fencing_token FROM {schema}.job_leases AS l
        WHERE l.job_key = %(job_key)s) AS token,
       job.task,
       pg_notify(%(channel)s, 'removed')::text AS notified
FROM job;
