"""The scheduler's asyncio source (runtime schedules); ``scheduler/_sync`` is generated from
it (``tools/async_to_sync.py``)."""
