# WARNING: this file is generated from src/tenure/scheduler/_async/__init__.py
# by tools/async_to_sync.py.
# Edit the async source and run `python tools/async_to_sync.py`; CI checks the two agree.
"""The scheduler's asyncio source (runtime schedules); ``scheduler/_sync`` is generated from
it (``tools/async_to_sync.py``)."""
