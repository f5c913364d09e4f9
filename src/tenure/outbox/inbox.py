"""The idempotent inbox: consumers apply each outbox message once.

The relay delivers at least once; :func:`claim` (or :func:`claim_async`), called in the
consumer's own transaction together with its side effect, returns False for a key that was
already applied, so the side effect commits at most once per key. Key it on the message's
business key: the webhook's ``Idempotency-Key`` header as it arrives with
:func:`claim_header`, or ``message.idempotency_key`` in a Python handler (the same string).
The inbox table lives in tenure's schema of the consumer's database (run
``tenure migrate`` there).
"""

from __future__ import annotations

from ._async.inbox import claim_async, claim_header_async
from ._sync.inbox import claim, claim_header

__all__ = ["claim", "claim_async", "claim_header", "claim_header_async"]
