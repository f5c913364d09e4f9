"""The implementation, written once for asyncio. ``tenure._sync`` is generated from this
package by tools/async_to_sync.py, so the two flavours cannot drift apart."""
