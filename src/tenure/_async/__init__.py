"""The asyncio implementation: the single source of truth. ``tenure._sync`` is generated
from this package by tools/async_to_sync.py."""
