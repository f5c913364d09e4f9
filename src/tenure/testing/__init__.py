"""Test your own jobs against lost leases: the ``tenure`` pytest plugin and its helpers.

Installed with tenure, the plugin (entry point ``pytest11``: ``tenure``) gives every test
suite these fixtures:

* ``tenure_dsn`` (session): ``$TENURE_TEST_DSN``, else ``$TENURE_DSN``, else the embedded
  PostgreSQL (the ``embedded`` extra).
* ``tenure_schema``: a throwaway schema, migrated, dropped after the test.
* ``tenure_client``: a :class:`tenure.Client` on that schema.
* ``tenure_leases``: :class:`LeaseHelpers` for that schema: expire a lease now, make a
  successor take over and write, start a holder in a real child process and pause it with
  ``SIGSTOP``.

So a test can prove that a job refuses to commit stale work: the job holds token N, a
successor takes over with N+1 and writes, and the job's own fenced write must then fail with
:class:`tenure.StaleTokenError`. docs/testing.md has an example.
"""

from __future__ import annotations

from .helpers import Holder, LeaseHelpers, Outcome, pick_dsn

__all__ = ["Holder", "LeaseHelpers", "Outcome", "pick_dsn"]
