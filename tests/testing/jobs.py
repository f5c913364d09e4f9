"""A job the holder tests run in their child process (tests/testing/test_plugin.py)."""

from __future__ import annotations

import tenure


def put_result(client: tenure.Client, lease: tenure.Lease) -> int:
    client.results.put(lease.job_key, {"by": "holder"}, token=lease.token)
    return lease.token
