"""tenure: PostgreSQL leases with fencing tokens.

A lease with an expiry is not enough: the old holder may still run when it expires. Every
takeover increments the job's fencing token, and every store of a result refuses tokens
older than the last it accepted. See docs/safety.md.
"""

from __future__ import annotations

import logging

from . import inbox, metrics, outbox
from ._async.client import AsyncClient, connect_async
from ._async.fencing import fence_async
from ._async.lease import AsyncLease, AsyncLeaseContext
from ._async.results import AsyncResults
from ._sync.client import Client, connect
from ._sync.fencing import fence
from ._sync.lease import Lease, LeaseContext
from ._sync.results import Results
from .errors import (
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailable,
    InvalidArgument,
    LeaseBusy,
    LeaseError,
    LeaseLost,
    SchemaNotReady,
    StaleTokenError,
    TenureError,
    Timeout,
    TokenNotIssued,
)
from .models import LeaseInfo, Result
from .scheduler import JobContext, Scheduler
from .validation import parse_duration

__version__ = "0.1.0"

# A library logs, the application decides where to: no output unless logging is configured.
logging.getLogger("tenure").addHandler(logging.NullHandler())

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
    "JobContext",
    "Lease",
    "LeaseBusy",
    "LeaseContext",
    "LeaseError",
    "LeaseInfo",
    "LeaseLost",
    "Result",
    "Results",
    "Scheduler",
    "SchemaNotReady",
    "StaleTokenError",
    "TenureError",
    "Timeout",
    "TokenNotIssued",
    "connect",
    "connect_async",
    "fence",
    "fence_async",
    "inbox",
    "metrics",
    "outbox",
    "parse_duration",
]
