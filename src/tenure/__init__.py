"""tenure: PostgreSQL leases with fencing tokens.

A lease with an expiry is not enough: the old holder may still run when it expires. Every
takeover increments the job's fencing token, and every store of a result refuses tokens
older than the last it accepted. See docs/safety.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import metrics
from .errors import (
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailable,
    InvalidArgument,
    InvalidArgumentType,
    JobOwnedByAnotherApp,
    JobStillDefined,
    LeaseBusy,
    LeaseError,
    LeaseLost,
    ScheduleConflict,
    SchemaNotReady,
    StaleTokenError,
    TenureError,
    Timeout,
    TokenNotIssued,
    UnknownJob,
)
from .leases._sync.client import Client, connect
from .leases._sync.fencing import fence
from .leases._sync.lease import Lease, LeaseContext
from .leases._sync.results import Results
from .leases.models import LeaseInfo, Result
from .validation import parse_duration

if TYPE_CHECKING:
    from . import outbox
    from .guard import OnceContext, once
    from .leases._async.client import AsyncClient, connect_async
    from .leases._async.fencing import fence_async
    from .leases._async.lease import AsyncLease, AsyncLeaseContext
    from .leases._async.results import AsyncResults
    from .outbox import inbox
    from .scheduler import JobContext, Scheduler
    from .scheduler._async.runtime import (
        add_schedule_async,
        add_schedules_async,
        backfill_schedule_async,
        get_schedule_async,
        list_schedules_async,
        pause_schedule_async,
        remove_schedule_async,
        remove_schedules_async,
        resume_schedule_async,
        schedule_changes_async,
        update_schedule_async,
    )
    from .scheduler._sync.runtime import (
        add_schedule,
        add_schedules,
        backfill_schedule,
        get_schedule,
        list_schedules,
        pause_schedule,
        remove_schedule,
        remove_schedules,
        resume_schedule,
        schedule_changes,
        update_schedule,
    )
    from .scheduler.definitions import ScheduleChange, ScheduleDef, ScheduleInfo, schedule_def

# Imported on first use, so that `tenure exec` in a crontab does not pay for asyncio, the
# scheduler and the outbox (PEP 562).
_LAZY = {
    "AsyncClient": ".leases._async.client",
    "connect_async": ".leases._async.client",
    "fence_async": ".leases._async.fencing",
    "AsyncLease": ".leases._async.lease",
    "AsyncLeaseContext": ".leases._async.lease",
    "AsyncResults": ".leases._async.results",
    "JobContext": ".scheduler",
    "OnceContext": ".guard",
    "once": ".guard",
    "Scheduler": ".scheduler",
    "add_schedule": ".scheduler._sync.runtime",
    "add_schedules": ".scheduler._sync.runtime",
    "backfill_schedule": ".scheduler._sync.runtime",
    "get_schedule": ".scheduler._sync.runtime",
    "list_schedules": ".scheduler._sync.runtime",
    "remove_schedule": ".scheduler._sync.runtime",
    "remove_schedules": ".scheduler._sync.runtime",
    "pause_schedule": ".scheduler._sync.runtime",
    "resume_schedule": ".scheduler._sync.runtime",
    "schedule_changes": ".scheduler._sync.runtime",
    "update_schedule": ".scheduler._sync.runtime",
    "add_schedule_async": ".scheduler._async.runtime",
    "add_schedules_async": ".scheduler._async.runtime",
    "backfill_schedule_async": ".scheduler._async.runtime",
    "get_schedule_async": ".scheduler._async.runtime",
    "list_schedules_async": ".scheduler._async.runtime",
    "remove_schedule_async": ".scheduler._async.runtime",
    "remove_schedules_async": ".scheduler._async.runtime",
    "pause_schedule_async": ".scheduler._async.runtime",
    "resume_schedule_async": ".scheduler._async.runtime",
    "schedule_changes_async": ".scheduler._async.runtime",
    "update_schedule_async": ".scheduler._async.runtime",
    "ScheduleChange": ".scheduler.definitions",
    "ScheduleDef": ".scheduler.definitions",
    "ScheduleInfo": ".scheduler.definitions",
    "schedule_def": ".scheduler.definitions",
    "inbox": ".outbox.inbox",
    "outbox": ".outbox",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tenure' has no attribute {name!r}")
    import importlib

    loaded = importlib.import_module(module, __name__)
    value = loaded if name in ("inbox", "outbox") else getattr(loaded, name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

# No NullHandler on "tenure": with one, a program that configures no logging (or only its
# server's own loggers, as uvicorn and gunicorn do) would never see a lost lease or a refused
# write. Without it, warnings and errors reach stderr through logging's last resort until the
# application configures logging, which then decides alone.

__all__ = [
    "AsyncClient",
    "AsyncLease",
    "AsyncLeaseContext",
    "AsyncResults",
    "Client",
    "ConfigurationError",
    "DatabaseError",
    "DatabaseUnavailable",
    "InvalidArgument",
    "InvalidArgumentType",
    "JobContext",
    "JobOwnedByAnotherApp",
    "JobStillDefined",
    "Lease",
    "LeaseBusy",
    "LeaseContext",
    "LeaseError",
    "LeaseInfo",
    "LeaseLost",
    "OnceContext",
    "Result",
    "Results",
    "ScheduleChange",
    "ScheduleConflict",
    "ScheduleDef",
    "ScheduleInfo",
    "Scheduler",
    "SchemaNotReady",
    "StaleTokenError",
    "TenureError",
    "Timeout",
    "TokenNotIssued",
    "UnknownJob",
    "add_schedule",
    "add_schedule_async",
    "add_schedules",
    "add_schedules_async",
    "backfill_schedule",
    "backfill_schedule_async",
    "connect",
    "connect_async",
    "fence",
    "fence_async",
    "get_schedule",
    "get_schedule_async",
    "inbox",
    "list_schedules",
    "list_schedules_async",
    "metrics",
    "once",
    "outbox",
    "parse_duration",
    "pause_schedule",
    "pause_schedule_async",
    "remove_schedule",
    "remove_schedule_async",
    "remove_schedules",
    "remove_schedules_async",
    "resume_schedule",
    "resume_schedule_async",
    "schedule_changes",
    "schedule_changes_async",
    "schedule_def",
    "update_schedule",
    "update_schedule_async",
]
