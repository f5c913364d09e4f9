"""A pure-Python TCP proxy to inject network faults between a client and PostgreSQL.

Modelled on psycopg's ``tests/fix_proxy.py`` but with no external binary: one accept thread
and two pump threads per connection, all daemons, so it works the same under sync and async
tests::

    with Proxy("127.0.0.1", 5432) as proxy:          # or Proxy.from_dsn(dsn)
        conn = psycopg.connect(proxy.dsn(dsn))
        proxy.cut()          # RST every open connection; new ones still work
        proxy.blackhole()    # partition: bytes stop flowing, new connections hang
        proxy.heal()         # end of the partition
        proxy.stop()         # server unreachable: RST everything, refuse new connections
        proxy.start()        # ... and back, on the same port

Fault semantics:

* :meth:`cut` resets (``SO_LINGER 0`` + close, so the peers get a RST) every connection
  open through the proxy.  Connections made afterwards work normally.
* :meth:`blackhole` stops moving bytes in both directions.  Nothing is read from the
  sockets (data piles up in the kernel buffers), nothing is closed: peers see a silent
  network.  New connections are accepted (the TCP handshake is done by the kernel anyway)
  but not connected upstream, so e.g. libpq's startup packet gets no answer.
* :meth:`heal` resumes forwarding.  Like a real partition healing under TCP retransmission,
  *old* connections resume too: pending bytes are delivered late, and connections accepted
  during the partition are connected upstream now (a peer that gave up in the meantime has
  closed its socket; the proxy then closes the matching upstream).  To model connections
  that die in the partition, call :meth:`cut` before :meth:`heal`.
* :meth:`stop` resets every connection and closes the listening socket (connection
  refused); :meth:`start` listens again on the same port.

Everything is bounded: threads are daemons, poll with short timeouts, and :meth:`stop`
returns within about 2 s.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType

from psycopg.conninfo import conninfo_to_dict, make_conninfo

logger = logging.getLogger("tenure.tests.proxy")

POLL = 0.05  # seconds: how often blocked threads look at the proxy state
CONNECT_TIMEOUT = 2.0  # seconds: to connect upstream
STOP_TIMEOUT = 2.0  # seconds: total budget of stop() to join its threads
BUFSIZE = 65536


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` abruptly: the peer gets a RST, not a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One client connection and (once connected) its upstream connection."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.dead = threading.Event()
        self._lock = threading.Lock()

    def attach(self, upstream: socket.socket) -> bool:
        """Set the upstream socket; False (and close it) if the link is already dead."""
        with self._lock:
            if self.dead.is_set():
                upstream.close()
                return False
            self.upstream = upstream
            for sock in (self.client, upstream):
                sock.setblocking(False)
            return True

    def close(self, *, reset: bool) -> None:
        with self._lock:
            if self.dead.is_set():
                return
            self.dead.set()
            for sock in (self.client, self.upstream):
                if sock is None:
                    continue
                if reset:
                    _reset(sock)
                else:
                    with contextlib.suppress(OSError):
                        sock.close()


class Proxy:
    """Forward ``host:port`` (127.0.0.1, a free port) to ``target_host:target_port``."""

    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1") -> None:
        self.target_host = target_host
        self.target_port = int(target_port)
        self.host = host
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._threads: set[threading.Thread] = set()
        self._running = threading.Event()
        self._forwarding = threading.Event()  # cleared while blackholed
        self._forwarding.set()
        self._accept_thread: threading.Thread | None = None
        # Bind now, so that port and dsn() are known before start().
        self._listener: socket.socket | None = self._listen(0)
        self.port: int = self._listener.getsockname()[1]

    @classmethod
    def from_dsn(cls, dsn: str) -> Proxy:
        """A proxy in front of the server that ``dsn`` points to (TCP, or a Unix socket
        directory such as the embedded server's: the proxy still listens on TCP)."""
        params = conninfo_to_dict(dsn)
        host = str(params.get("hostaddr") or params.get("host") or "127.0.0.1")
        return cls(host, int(params.get("port") or 5432))

    def _connect_upstream(self) -> socket.socket:
        if self.target_host.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(CONNECT_TIMEOUT)
            try:
                sock.connect(f"{self.target_host}/.s.PGSQL.{self.target_port}")
            except OSError:
                sock.close()
                raise
            return sock
        return socket.create_connection(
            (self.target_host, self.target_port), timeout=CONNECT_TIMEOUT
        )

    # -- public API ---------------------------------------------------------------------

    def dsn(self, base_dsn: str) -> str:
        """``base_dsn`` with host and port replaced by the proxy's; other params kept."""
        params = conninfo_to_dict(base_dsn)
        params.pop("hostaddr", None)
        params["host"] = self.host
        params["port"] = str(self.port)
        return make_conninfo("", **params)

    def start(self) -> None:
        """Start accepting and forwarding (again, on the same port, after stop())."""
        with self._lock:
            if self._running.is_set():
                return
            if self._listener is None:
                self._listener = self._listen(self.port)
            self._running.set()
            self._accept_thread = self._spawn(self._accept_loop, self._listener, name="accept")

    def stop(self) -> None:
        """Reset every connection, stop listening and join the threads (within ~2 s)."""
        deadline = time.monotonic() + STOP_TIMEOUT
        with self._lock:
            self._running.clear()
            listener, self._listener = self._listener, None
            links = list(self._links)
            self._links.clear()
            threads = list(self._threads)
        for link in links:
            link.close(reset=True)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.close()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._threads.difference_update(t for t in threads if not t.is_alive())

    def cut(self) -> None:
        """Reset (RST) every connection open now; new connections still work."""
        with self._lock:
            links = list(self._links)
            self._links.clear()
        for link in links:
            link.close(reset=True)

    def blackhole(self) -> None:
        """Stop moving bytes and stop connecting new clients upstream, until heal()."""
        self._forwarding.clear()

    def heal(self) -> None:
        """End blackhole(): every surviving connection, old or new, flows again."""
        self._forwarding.set()

    @property
    def blackholed(self) -> bool:
        return not self._forwarding.is_set()

    @property
    def connections(self) -> int:
        """Number of client connections currently open through the proxy."""
        with self._lock:
            return sum(1 for link in self._links if not link.dead.is_set())

    def __enter__(self) -> Proxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"<Proxy {self.host}:{self.port} -> {self.target_host}:{self.target_port}"
            f"{' running' if self._running.is_set() else ''}"
            f"{' blackholed' if self.blackholed else ''}>"
        )

    # -- internals ----------------------------------------------------------------------

    def _listen(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, port))
            sock.listen(64)
        except BaseException:
            sock.close()
            raise
        return sock

    def _spawn(self, target: Callable[..., object], *args: object, name: str) -> threading.Thread:
        thread = threading.Thread(
            target=target, args=args, name=f"proxy-{self.port}-{name}", daemon=True
        )
        self._threads = {t for t in self._threads if t.is_alive()}
        self._threads.add(thread)
        thread.start()
        return thread

    def _accept_loop(self, listener: socket.socket) -> None:
        while self._running.is_set():
            try:
                ready, _, _ = select.select([listener], [], [], POLL)
                if not ready:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):  # closed by stop()
                return
            link = _Link(client)
            with self._lock:
                if not self._running.is_set():
                    link.close(reset=True)
                    return
                self._links.add(link)
                self._spawn(self._serve, link, name="link")

    def _wait_forwarding(self, link: _Link) -> bool:
        """Block while blackholed; False if the link or the proxy went away meanwhile."""
        while not self._forwarding.wait(POLL):
            if link.dead.is_set() or not self._running.is_set():
                return False
        return not link.dead.is_set() and self._running.is_set()

    def _serve(self, link: _Link) -> None:
        """Connect a client upstream, then pump client -> upstream (and spawn the reverse)."""
        if not self._wait_forwarding(link):
            return
        try:
            upstream = self._connect_upstream()
        except OSError as exc:
            logger.debug("proxy: cannot connect upstream: %s", exc)
            self._drop(link, reset=True)
            return
        if not link.attach(upstream):
            return
        with self._lock:
            if self._running.is_set():
                self._spawn(self._pump, link, upstream, link.client, name="down")
        self._pump(link, link.client, upstream)

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while self._wait_forwarding(link):
                ready, _, _ = select.select([src], [], [], POLL)
                if not ready:
                    continue
                try:
                    data = src.recv(BUFSIZE)
                except BlockingIOError:
                    continue
                if not data:  # EOF: end the whole link, as a plain TCP proxy would
                    break
                if not self._send_all(link, dst, data):
                    return
        except (OSError, ValueError) as exc:  # reset by the peer, or closed by cut()/stop()
            logger.debug("proxy: link ended: %s", exc)
            self._drop(link, reset=True)
            return
        self._drop(link, reset=False)

    def _send_all(self, link: _Link, dst: socket.socket, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            if not self._wait_forwarding(link):
                return False
            _, ready, _ = select.select([], [dst], [], POLL)
            if not ready:
                continue
            try:
                sent = dst.send(view)
            except BlockingIOError:
                continue
            view = view[sent:]
        return True

    def _drop(self, link: _Link, *, reset: bool) -> None:
        link.close(reset=reset)
        with self._lock:
            self._links.discard(link)
