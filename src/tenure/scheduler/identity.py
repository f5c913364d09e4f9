"""Who a worker is: its id, host and pid, as its history rows, logs and connections name it."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """One worker process's name in history rows (worker, host, pid), logs and
    ``pg_stat_activity``."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)

    @property
    def label(self) -> str:
        return f"worker {self.id} ({self.host} pid {self.pid})"

    @property
    def application_name(self) -> str:
        """What pg_stat_activity shows for this worker's connections."""
        return f"tenure worker {self.id}"
