"""``tenure verify``: prove the guarantee on a deployment, with its pooler and its TTLs.

Worker processes (:mod:`.worker`) run what users run: library leases with ``fence()`` on the
application's own connection and ``results.put``, and the scheduler's claim path. A nemesis
(:mod:`.nemesis`) pauses them past their TTL, kills them and terminates their backends. The
evidence is what the database itself recorded (triggers in the run's throwaway schema,
``sql/verify.sql``) plus every operation's outcome as the workers saw it
(:mod:`.history`); the checker (:mod:`.checker`) verifies the invariants of
docs/invariants.md on it; :mod:`.report` renders the verdict as text, JSON or HTML.

::

    from tenure.verify import VerifyConfig, run
    result = run(VerifyConfig(dsn="postgresql://...", duration=30))
    print(result.text())          # ... last line: "verdict: PASS" or "verdict: FAIL ..."
"""

from __future__ import annotations

from .checker import INVARIANTS, CheckResult, Violation, check
from .config import FAULTS, VerifyConfig, parse_faults
from .report import VerifyResult
from .runner import Progress, VerifyError, run

__all__ = [
    "FAULTS",
    "INVARIANTS",
    "CheckResult",
    "Progress",
    "VerifyConfig",
    "VerifyError",
    "VerifyResult",
    "Violation",
    "check",
    "parse_faults",
    "run",
]
