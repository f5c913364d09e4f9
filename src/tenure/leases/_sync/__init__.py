# WARNING: this file is generated from src/tenure/leases/_async/__init__.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
"""The implementation, written once for asyncio. ``tenure._sync`` is generated from this
package by tools/async_to_sync.py, so the two flavours cannot drift apart."""
