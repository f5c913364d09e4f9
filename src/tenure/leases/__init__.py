"""The lease core: acquire/renew/release with fencing tokens, fenced transactions and the
result store. Written once as asyncio in ``_async``; ``_sync`` is generated from it."""
