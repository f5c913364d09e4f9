"""The client a part of the worker (claimer, starter, finisher) sends its statements on."""

from __future__ import annotations

from ..leases._async.client import AsyncClient


class OnClient:
    """A part of a worker: built with the worker, attached to its client once it connects."""

    _client: AsyncClient | None = None

    @property
    def client(self) -> AsyncClient:
        assert self._client is not None, "the worker is not running"
        return self._client

    def attach(self, client: AsyncClient) -> None:
        self._client = client
