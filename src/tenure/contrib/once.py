"""Deprecated alias of :mod:`tenure.guard` (``@tenure.once`` needs no extra, so it is not an
integration). Import ``tenure.once`` / ``tenure.OnceContext``, or from ``tenure.guard``."""

from __future__ import annotations

import warnings

from ..guard import Attempt, Guard, OnceContext, OnceResults, once, slot_tick

warnings.warn(
    "tenure.contrib.once moved to tenure.guard; import tenure.once and tenure.OnceContext "
    "(or from tenure.guard) instead: this alias will be removed",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["Attempt", "Guard", "OnceContext", "OnceResults", "once", "slot_tick"]
