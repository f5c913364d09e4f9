"""The fault-injection run: N worker processes on K keys with short TTLs, a nemesis, a checker.

Run it (own throwaway PostgreSQL, all faults, 60 s)::

    python -m tests.chaos --seconds 60 --workers 6 --keys 3
    python -m tests.chaos --seconds 10 --no-fence --expect-violations   # must find violations

Pieces:

* :mod:`tests.chaos.worker`: one worker process. It loops: acquire (``tenure.Client``),
  "work" (sleep), write a result through ``client.results.put`` and a ledger row through a
  fenced transaction (``tenure.fence`` + INSERT), renew, ..., release. Every operation is
  logged as two JSON lines (begin, end) with the database's timestamps and an outcome:
  ``ok``, ``busy``, ``stale`` (refused by the fence), ``lost``, ``error`` (definitely not
  applied) or ``unknown`` (may or may not have committed; a begin line without an end line
  -- the worker was killed -- is unknown too).
* :mod:`tests.chaos.nemesis`: pauses workers past their TTL (SIGSTOP/SIGCONT), kills them
  (SIGKILL; the runner starts a new incarnation), terminates their backends
  (``pg_terminate_backend``) and restarts the PostgreSQL server (only a server the run
  started itself).
* :mod:`tests.chaos.checker`: verifies the invariants on the logs and on the tables.
* :mod:`tests.chaos.runner`: wires it together and prints a summary.

``--no-fence`` makes the workers write the ledger without ``tenure.fence`` and the result
with an unconditional upsert: the checker must then report violations, which shows it can
fail.
"""
