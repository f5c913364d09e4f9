"""The dashboard as an ASGI application (Starlette): mount it in your own ASGI app, or serve
it with ``tenure ui``.

    from tenure.ui import Dashboard
    dashboard = Dashboard(dsn, schema="tenure")
    app.mount("/tenure", dashboard.app)          # Starlette / FastAPI
    ...
    await dashboard.close()                       # at shutdown

Pages are rendered on the server (Jinja2, autoescaped); one small hand-written script makes
times local, counts leases down and reloads the page's content when the database changes
(Server-Sent Events fed by LISTEN/NOTIFY, polling only when events are unavailable).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..db.dsn import describe, resolve
from ..errors import ConfigurationError, DatabaseUnavailable, TenureError, one_line, printable
from ..validation import check_schema
from . import charts, data, security
from .actions import ACTIONS, Actions
from .live import Broker
from .proxy import behind_proxy, check_root_path, parse_allow
from .timeline import GLYPH, LABEL, render

log = logging.getLogger("tenure.ui")

Handler = Callable[[Request], Awaitable[Response]]
#: The query parameters of an action's notice (never carried to the next page).
NOTICE = ("notice", "sig")
#: Seconds between keep-alive comments on an idle event stream.
KEEPALIVE = 15.0


def _shown(value: Any) -> Any:
    """Every ``{{ value }}`` of a page: text as :func:`printable` shows it (a U+202E in a key
    would reverse what follows it), before autoescaping. Markup (the timeline's SVG) was
    built from printable text already."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable(value)
    return value


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("tenure.ui", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_shown,
    )
    env.filters["iso"] = lambda t: "" if t is None else t.astimezone(dt.UTC).isoformat()
    env.filters["utc"] = lambda t: (
        "" if t is None else t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    )
    env.filters["age"] = _age
    env.filters["inzone"] = _in_zone
    return env


def _in_zone(t: dt.datetime, zone: str) -> str:
    """``t`` in a job's own time zone, named: a cron job's slot as its schedule reads it
    (the page's other times are in the browser's zone, or UTC without the script)."""
    try:
        local = t.astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        return zone
    return f"{local:%Y-%m-%d %H:%M:%S} {zone}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    n = abs(seconds)
    if n < 60:
        text = f"{n:.1f}s"
    elif n < 3600:
        text = f"{n / 60:.0f} min"
    elif n < 86400:
        text = f"{n / 3600:.1f} h"
    else:
        text = f"{n / 86400:.1f} d"
    return text


class Dashboard:
    """The dashboard for one schema. ``actions`` needs ``credential``: a read-only dashboard
    (the default) changes nothing in the database. ``stream=False``: no server-sent events
    (``/events`` answers 204 and pages poll every 5 s), for servers where an open stream
    would hold a worker for as long as a page is open (WSGI, see :func:`wsgi_app`).

    Behind a reverse proxy under a path prefix: ``root_path="/ops/tenure"`` (links, assets,
    cookies and redirects carry it; the proxy may strip it or pass it on).
    ``forwarded_allow_ips``: the proxy addresses (``"127.0.0.1,10.0.0.0/8"``, ``"*"``)
    whose ``X-Forwarded-Proto``, ``-Host``, ``-For`` and ``-Prefix`` are believed; by
    default none are."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "tenure",
        actions: bool = False,
        credential: str | None = None,
        stream: bool = True,
        root_path: str = "",
        forwarded_allow_ips: str | None = None,
    ) -> None:
        self.schema = check_schema(schema)
        trusted = parse_allow(forwarded_allow_ips)
        check_root_path(root_path)
        if actions and not credential:
            raise ConfigurationError(
                "dashboard actions need a credential: set one (--token / $TENURE_UI_TOKEN) or "
                "leave actions off"
            )
        if credential is not None and not credential.strip():
            raise ConfigurationError("the dashboard credential is empty")
        conninfo, _source = resolve(dsn)
        self.where = describe(conninfo)  # never the password
        self.credential = credential
        self.actions_enabled = actions
        self.stream = stream
        self.reader = data.Reader(conninfo, self.schema)
        self.broker = Broker(conninfo, self.schema)
        self._actions = Actions(conninfo, self.schema) if actions else None
        self.csrf = security.Csrf()
        self.templates = _env()
        static = StaticFiles(packages=[("tenure.ui", "static")])
        self.starlette = Starlette(
            routes=[
                Route("/", self._guard(self.overview), name="overview"),
                Route("/jobs", self._guard(self.jobs), name="jobs"),
                Route("/job", self._guard(self.job), name="job"),
                Route("/schedules", self._guard(self.schedules), name="schedules"),
                Route("/schedule", self._guard(self.schedule), name="schedule"),
                Route("/leases", self._guard(self.leases), name="leases"),
                Route("/outbox", self._guard(self.outbox), name="outbox"),
                Route("/workers", self._guard(self.workers), name="workers"),
                Route("/events", self._guard(self.events), name="events"),
                Route("/action/{action}", self._guard(self.action), methods=["POST"]),
                Mount("/static", app=static, name="static"),
            ],
            lifespan=self._lifespan,
        )
        #: The ASGI app to serve or mount (the Starlette app, behind the root path and the
        #: trusted proxy's headers when given).
        self.app: Any = behind_proxy(self.starlette, root_path=root_path, trusted=trusted)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        yield
        await self.close()

    async def close(self) -> None:
        await self.broker.close()
        await self.reader.close()
        if self._actions is not None:
            await run_in_threadpool(self._actions.close)

    # -- plumbing -------------------------------------------------------------------------

    def _guard(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            if not security.credential_ok(self.credential, request.headers.get("authorization")):
                return PlainTextResponse(
                    "this dashboard needs its credential (HTTP Basic password, or "
                    "Authorization: Bearer)\n",
                    status_code=401,
                    headers={"WWW-Authenticate": 'Basic realm="tenure", charset="UTF-8"'},
                )
            if any("\x00" in v for _, v in request.query_params.multi_items()):
                # PostgreSQL text cannot hold NUL: refuse it here, not as a database error.
                return PlainTextResponse(
                    "a query parameter contains a NUL byte, which no key or search can hold\n",
                    status_code=400,
                )
            try:
                return await handler(request)
            except DatabaseUnavailable as exc:
                return self._error(request, 503, str(exc))
            except psycopg.errors.UndefinedTable:
                return self._error(
                    request,
                    503,
                    f"schema {self.schema!r} on {self.where} has no tenure tables (or an old "
                    "version): run `tenure migrate`",
                )
            except psycopg.Error as exc:
                log.warning("dashboard query failed: %s", exc)
                return self._error(request, 500, f"database error: {one_line(str(exc))}")

        return guarded

    def _error(self, request: Request, status: int, message: str) -> Response:
        return self._page(request, "error.html", {"message": message}, status=status)

    def _session(self, request: Request) -> tuple[str, bool]:
        current = request.cookies.get(security.COOKIE)
        if current:
            return current, False
        return self.csrf.new_session(), True

    def _page(
        self, request: Request, name: str, context: dict[str, Any], *, status: int = 200
    ) -> Response:
        session, fresh = self._session(request)
        base = request.scope.get("root_path", "").rstrip("/")
        ctx = {
            "base": base,
            "schema": self.schema,
            "where": self.where,
            "actions": self.actions_enabled,
            "stream": self.stream,
            "csrf": self.csrf.token_for(session),
            "here": _here(request),
            "notice": self.csrf.signed(
                request.query_params.get("notice"), request.query_params.get("sig")
            ),
            "windows": data.WINDOWS,
            **context,
        }
        html = self.templates.get_template(name).render(ctx)
        response = HTMLResponse(html, status_code=status)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'"
        )
        if fresh:
            response.set_cookie(
                security.COOKIE,
                session,
                httponly=True,
                samesite="strict",
                path=base or "/",
            )
        return response

    # -- pages --------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        view = await self.reader.overview()
        chart = None
        if view.throughput is not None:
            chart = charts.render(view.throughput, what="every job", ident="tp-all")
        return self._page(request, "overview.html", {"page": "overview", "o": view, "chart": chart})

    async def jobs(self, request: Request) -> Response:
        q = request.query_params
        state = q.get("state", "all")
        sort = q.get("sort", "key")
        if state not in data.JOB_STATES:
            state = "all"
        if sort not in data.JOB_SORTS:
            sort = "key"
        desc = q.get("desc") == "1"
        search = (q.get("q") or "").strip()[:200] or None
        page = _int(q.get("page"), 1)
        view = await self.reader.jobs(state=state, sort=sort, desc=desc, search=search, page=page)

        def link(**changes: Any) -> str:
            params = {"state": state, "sort": sort, "desc": "1" if desc else "", "q": search or ""}
            params.update({k: str(v) for k, v in changes.items()})
            return "?" + urlencode({k: v for k, v in params.items() if v})

        return self._page(
            request,
            "jobs.html",
            {"page": "jobs", "v": view, "link": link, "states": data.JOB_STATES},
        )

    async def job(self, request: Request) -> Response:
        key = request.query_params.get("key", "")
        window = request.query_params.get("window", "fit")
        job = await self.reader.job(key) if key else None
        if job is None:
            return self._error(request, 404, f"no lease, schedule or result for key {key!r}")
        seconds = dict(data.WINDOWS).get(window)
        if seconds is None:
            window = "fit"
        since = None if seconds is None else job.now - dt.timedelta(seconds=seconds)
        view = await self.reader.timeline(key, since, job.now)
        runs, drawn_since = view.runs, view.since
        if not job.scheduled and not runs and not view.history:
            # A bare library lease: its lease events (migration 18) and its lease row are
            # all there is to draw.
            runs = data.lease_runs(job, await self.reader.lease_events(key, since))
            if since is None and runs:  # "newest runs": fit the window to the leases
                first = min(r.slot for r in runs)
                margin = max(dt.timedelta(seconds=2), (job.now - first) / 20)
                drawn_since = min(drawn_since, first - margin)
        timeline = render(runs, since=drawn_since, now=job.now, job_key=key, density=view.density)
        chart = None
        if job.scheduled:  # the scheduler's history (job_runs)
            rates = await self.reader.throughput(key, drawn_since, job.now)
            chart = charts.render(rates, what=key, ident="tp-job")
        return self._page(
            request,
            "job.html",
            {
                "page": "jobs",
                "job": job,
                "runs": runs,
                "history": view.history,
                "dense": view.dense,
                "timeline": timeline,
                "chart": chart,
                "window": window,
                "key_query": urlencode({"key": key}),
                "live_keys": [key],
                # Every mark the timeline draws, from its own tables (they cannot drift).
                "legend": [(o, glyph, LABEL[o]) for o, glyph in GLYPH.items()],
            },
        )

    async def schedules(self, request: Request) -> Response:
        search = (request.query_params.get("q") or "").strip()[:200] or None
        after = (request.query_params.get("after") or "")[:200]
        rows = await self.reader.schedules(search=search, after=after)
        more = len(rows) == data.SCHEDULES_PAGE
        nxt = urlencode({"q": search or "", "after": rows[-1].key}) if more else None
        return self._page(
            request,
            "schedules.html",
            {"page": "schedules", "rows": rows, "search": search, "next": nxt},
        )

    async def schedule(self, request: Request) -> Response:
        key = request.query_params.get("key", "")[:200]
        info, changes = await self.reader.schedule(key) if key else (None, [])
        if info is None and not changes:
            return self._error(request, 404, f"no runtime schedule {key!r}")
        return self._page(
            request,
            "schedule.html",
            {
                "page": "schedules",
                "s": info,
                "key": key,
                "changes": changes,
                "args_text": None if info is None else json.dumps(info.args, ensure_ascii=False),
            },
        )

    async def leases(self, request: Request) -> Response:
        search = (request.query_params.get("q") or "").strip()[:200] or None
        page = _int(request.query_params.get("page"), 1)
        view = await self.reader.leases(search=search, page=page)
        return self._page(request, "leases.html", {"page": "leases", "v": view})

    async def workers(self, request: Request) -> Response:
        workers, now = await self.reader.workers()
        context = {
            "page": "workers",
            "workers": workers,
            "now": now,
            "lag_warning": data.LOOP_LAG_WARNING,
        }
        return self._page(request, "workers.html", context)

    async def outbox(self, request: Request) -> Response:
        topics, dead, now = await self.reader.outbox()
        return self._page(
            request, "outbox.html", {"page": "outbox", "topics": topics, "dead": dead, "now": now}
        )

    async def events(self, request: Request) -> Response:
        """Server-Sent Events: ``data: ["key", ...]`` when those jobs (or ``*``: anything)
        changed. ``?key=K`` (repeatable) limits events to those keys. Without streams: 204,
        which tells an EventSource not to reconnect (the page polls instead)."""
        if not self.stream:
            return Response(status_code=204, headers={"Cache-Control": "no-store"})
        wanted = set(request.query_params.getlist("key"))
        queue = self.broker.subscribe()
        # Open the stream once LISTEN is in place: from then on no change is missed.
        await self.broker.ready(5.0)

        async def stream() -> AsyncIterator[str]:
            try:
                yield "retry: 2000\n: listening\n\n"
                while True:
                    try:
                        async with asyncio.timeout(KEEPALIVE):
                            changed = await queue.get()
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if "*" in changed or not wanted or wanted & changed:
                        yield f"data: {json.dumps(sorted(changed)[:100])}\n\n"
            finally:
                self.broker.unsubscribe(queue)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def action(self, request: Request) -> Response:
        action = request.path_params["action"]
        if self._actions is None:
            return PlainTextResponse(
                "actions are off: start the dashboard with --actions and a --token\n",
                status_code=403,
            )
        if action not in ACTIONS:
            return PlainTextResponse(f"unknown action {action!r}\n", status_code=404)
        if not security.same_origin(request.headers, request.url.scheme):
            return PlainTextResponse("cross-origin POST refused\n", status_code=403)
        # Room for a bulk action's page of keys (200 characters each, percent-encoded).
        body = (await request.body())[:100_000].decode("utf-8", "replace")
        fields = parse_qs(body)
        form = {k: v[0] for k, v in fields.items()}
        if not self.csrf.check(request.cookies.get(security.COOKIE), form.get(security.FIELD)):
            return PlainTextResponse(
                "missing or wrong CSRF token: reload the page and try again\n", status_code=403
            )
        target = form.get("target", "")
        back = form.get("next", "/")
        # Only a path of this dashboard: "//host" or "/\\host" would leave it.
        if not back.startswith("/") or back[1:2] in ("/", "\\"):
            back = "/"
        base = request.scope.get("root_path", "").rstrip("/")
        try:
            if action.startswith("bulk-"):
                targets = fields.get("target", [])
                message = await run_in_threadpool(self._actions.run_bulk, action, targets)
            else:
                message = await run_in_threadpool(self._actions.run, action, target, form)
        except (TenureError, ValueError) as exc:
            message = f"{action} failed: {exc}"
        log.warning("dashboard action %s %r: %s", action, target, message)
        sep = "&" if "?" in back else "?"
        notice = urlencode({"notice": message, "sig": self.csrf.sign(message)})
        return RedirectResponse(f"{base}{back}{sep}{notice}", status_code=303)


def _here(request: Request) -> str:
    """This page's path and query, relative to the dashboard, without a previous notice
    (where an action form sends the browser back)."""
    root = request.scope.get("root_path", "").rstrip("/")
    path = request.url.path
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k not in NOTICE])
    return path + (f"?{query}" if query else "")


def _int(value: str | None, default: int) -> int:
    try:
        return max(1, min(1_000_000, int(value or default)))
    except ValueError:
        return default


def create_app(
    dsn: str | None = None,
    *,
    schema: str = "tenure",
    actions: bool = False,
    credential: str | None = None,
) -> Starlette:
    """The dashboard's ASGI app (closes its connections on the app's lifespan shutdown)."""
    return Dashboard(dsn, schema=schema, actions=actions, credential=credential).starlette
