"""The child process behind :class:`tenure.testing.Holder` (``python -m tenure.testing._holder``).

Reads JSON lines on stdin, answers one JSON line each on stdout: first its settings (it
acquires the lease and answers its token), then ``{"run": true}`` for each run of the target.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def _answer(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    from tenure.leases._sync.client import connect

    settings = json.loads(sys.stdin.readline())
    try:
        client = connect(settings["dsn"], schema=settings["schema"])
        lease = client.acquire(settings["job_key"], ttl=settings["ttl"])
        target = None
        if settings["target"]:
            module, _, name = settings["target"].partition(":")
            target = getattr(importlib.import_module(module), name)
    except Exception as exc:  # reported to the parent, which raises
        _answer({"message": f"{type(exc).__name__}: {exc}"})
        return 1
    if lease is None:
        info = client.inspect(settings["job_key"])
        assert info is not None  # acquire found a live lease
        _answer({"busy": {"token": info.token, "expires_at": info.expires_at.isoformat()}})
        return 1
    _answer({"token": lease.token})
    for line in sys.stdin:
        if not json.loads(line).get("run"):
            continue
        try:
            value = None if target is None else target(client, lease)
        except Exception as exc:  # the job's own failure is the answer, not the child's end
            _answer({"error": type(exc).__name__, "message": str(exc)})
        else:
            _answer({"error": None, "value": repr(value)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
