"""The database layer's asyncio source; ``db/_sync`` is generated from it
(``tools/async_to_sync.py``)."""
