"""The dashboard behind a reverse proxy: a fixed path prefix (``root_path``), and the
proxy's ``X-Forwarded-*`` headers, believed only from the addresses it is told to trust
(as uvicorn's ``--forwarded-allow-ips``; by default none: any client could send them).

Both are ASGI middleware around the dashboard's Starlette app. The prefix follows uvicorn's
``--root-path``: ``root_path`` grows by it and so does ``path`` (Starlette strips it again
when routing), so a proxy may pass the prefix on or strip it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from ..errors import ConfigurationError

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

#: A prefix as a proxy may give it: path segments of unreserved characters, no dot segment.
_PREFIX = re.compile(r"^(/[A-Za-z0-9_~!$&'()*+,;=:@%-][A-Za-z0-9._~!$&'()*+,;=:@%-]*)*$")
_HOST = re.compile(r"^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")


def check_root_path(root_path: str) -> str:
    """``/ops/tenure`` (a trailing slash dropped; empty: none), or ConfigurationError."""
    value = root_path.strip().rstrip("/")
    if value and not _PREFIX.match(value):
        raise ConfigurationError(
            f"root path {root_path!r} is not a URL path prefix: give one like /ops/tenure "
            "(segments of letters, digits and -._~, no '..')"
        )
    return value


def _with_prefix(scope: Scope, prefix: str) -> Scope:
    root = prefix + scope.get("root_path", "")
    path = scope["path"]
    new = dict(scope, root_path=root)
    if not path.startswith(root):  # the proxy stripped the prefix: put it back
        new["path"] = prefix + path
        new["raw_path"] = prefix.encode() + scope.get("raw_path", path.encode())
    return new


class Trusted:
    """Which peers may speak for the client: addresses and networks, or ``*`` (any)."""

    def __init__(self, allow: Iterable[str]) -> None:
        self.any = False
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for item in allow:
            item = item.strip()
            if not item:
                continue
            if item == "*":
                self.any = True
                continue
            try:
                self.networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ConfigurationError(
                    f"forwarded-allow-ips: {item!r} is not an IP address or network (CIDR); "
                    "give e.g. 127.0.0.1,10.0.0.0/8 or *"
                ) from None

    def __bool__(self) -> bool:
        return self.any or bool(self.networks)

    def __contains__(self, host: str | None) -> bool:
        if self.any:
            return True
        if host is None:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a unix socket's peer has no address: not trusted by address
        return any(address in network for network in self.networks)


def parse_allow(value: str | None) -> Trusted:
    """``127.0.0.1,10.0.0.0/8`` (comma-separated), ``*``, or empty: trust none."""
    return Trusted((value or "").split(","))


class Proxied:
    """``app`` under a path prefix, and a trusted proxy's ``X-Forwarded-Proto`` (the
    scheme), ``X-Forwarded-Host`` (the Host the browser used, which the same-origin check
    compares with ``Origin``), ``X-Forwarded-For`` (the client's address: the nearest one
    not trusted) and ``X-Forwarded-Prefix`` (the prefix it serves the dashboard under; it
    wins over ``root_path``: both say the same thing). From any other peer they are
    ignored."""

    def __init__(self, app: ASGIApp, root_path: str, trusted: Trusted) -> None:
        self.app = app
        self.prefix = check_root_path(root_path)
        self.trusted = trusted

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            prefix = self.prefix
            client = scope.get("client")
            if self.trusted and client and client[0] in self.trusted:
                scope, prefix = self._forwarded(scope, prefix)
            if prefix:
                scope = _with_prefix(scope, prefix)
        await self.app(scope, receive, send)

    def _forwarded(self, scope: Scope, prefix: str) -> tuple[Scope, str]:
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", []))
        found: dict[bytes, str] = {}
        for name, value in headers:
            if name.startswith(b"x-forwarded-"):
                # Several headers of one name: the nearest proxy's is the last one.
                found[name] = value.decode("latin-1").strip()
        scope = dict(scope)
        proto = found.get(b"x-forwarded-proto", "").split(",")[-1].strip().lower()
        if proto in ("http", "https"):
            scope["scheme"] = proto if scope["type"] == "http" else proto.replace("http", "ws")
        host = found.get(b"x-forwarded-host", "").split(",")[-1].strip()
        if host and _HOST.match(host):
            scope["headers"] = [(n, v) for n, v in headers if n != b"host"] + [
                (b"host", host.encode("latin-1"))
            ]
        chain = [h.strip() for h in found.get(b"x-forwarded-for", "").split(",") if h.strip()]
        for address in reversed(chain):  # the nearest address not one of the proxies
            if address not in self.trusted or address == chain[0]:
                port = scope["client"][1] if scope.get("client") else 0
                scope["client"] = (address, port)
                break
        forwarded = found.get(b"x-forwarded-prefix", "").rstrip("/")
        if forwarded and _PREFIX.match(forwarded):
            prefix = forwarded
        return scope, prefix


def behind_proxy(app: ASGIApp, *, root_path: str = "", trusted: Trusted | None = None) -> Any:
    """``app`` itself, or wrapped in :class:`Proxied` if a root path or a trusted proxy is
    given."""
    trusted = trusted or Trusted(())
    if not check_root_path(root_path) and not trusted:
        return app
    return Proxied(app, root_path, trusted)
