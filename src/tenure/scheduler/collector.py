"""Python's cyclic garbage collector in a ``tenure worker`` process.

A worker holding 120,000 job definitions keeps about 500,000 objects tracked by the collector.
At 2,000 runs/s, every run's objects were alive through young collections and were promoted.
So a full collection came every 2-3 s and walked all of them, 90-165 ms with the event loop
stopped, and the slots due in that time were late by as much (bench/README.md, "The
scale-out table after the third pass"). A run leaves no reference cycle
(``tests/scheduler/test_run_garbage.py``): collecting less often keeps no more memory.
"""

from __future__ import annotations

import gc

#: Allocations between young-generation collections in a worker process (CPython: 700).
GEN0_THRESHOLD = 10_000


def settle() -> None:
    """For a process that is a tenure worker and nothing else: move what exists now (the
    app, its job definitions, the imported modules) to the collector's permanent generation,
    and collect the young generation less often. ``Scheduler.run()`` embedded in another
    program does not call this: the collector belongs to that program."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, middle, old)
