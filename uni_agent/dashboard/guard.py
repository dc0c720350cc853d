"""Who may read the scheduler's pages: only a request that carries the run's token.

Dask's dashboard and the uni-agent page show prompts, trajectories, hidden test names and results, worker logs, call
stacks and paths, on a port every user of the node can reach. `PageGuard`, a scheduler plugin, puts every route of
the scheduler's HTTP server behind one token: Dask's pages and JSON, bokeh's apps and their websockets, /metrics,
/health, the uni-agent page, and whatever is added later. A request gets through with

    ?token=T                     on a GET: answered with a cookie (HttpOnly, SameSite=Strict, Path=/) and a redirect
                                 to the same address without the token, as notebook servers do; the cookie then
                                 carries the browser, websockets included
    Authorization: Bearer T      scrapers (Prometheus' credentials_file) and scripts

and anything else gets 403 and nothing more, as does a request another origin's page sends (its Origin header names
another host or port), cookie or not. The check sits in front of the routing of Dask's RoutingApplication
(its find_handler: every request passes there before any handler of Dask, bokeh or ours runs).

The token reaches its user two ways: the driver prints the address with it (`page_token`, run on the scheduler over
the authenticated comm), and the scheduler's process writes it to ~/.config/uni-agent/dashboard/<host>-<port>.token
(0600, in a 0700 directory; removed when the scheduler closes) for scrapers.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import socket
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import httputil, web

from ..logs import keep_strangers_off_console
from ..sandbox.private_dir import ensure_private_dir

logger = logging.getLogger("uni_agent.dashboard")
TOKEN_PARAMETER = "token"
TOKEN_DIR = "~/.config/uni-agent/dashboard"  # next to the TLS credentials (uni_agent.driver.tls.DEFAULT_DIR)


class PageGuard(SchedulerPlugin):
    """One per scheduler (fixed name, idempotent). `guard_pages(scheduler)` installs it at once; added at the
    scheduler's start (a preload), it installs itself when the scheduler starts its plugins."""

    name = "uni-agent-page-guard"
    idempotent = True

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(32)
        self.token_file: Path | None = None
        self.cookie = "uni-agent-token"
        self._app: Any = None
        self._route: Any = None  # the application's own routing, called once a request has shown the token

    async def start(self, scheduler: Any) -> None:
        self.install(scheduler)

    def install(self, scheduler: Any) -> None:
        app = getattr(scheduler, "http_application", None)
        if app is None or self._app is not None:
            return
        port = scheduler.http_server.port
        self.cookie = f"uni-agent-token-{port}"  # cookies ignore ports: one name per server on the same host
        self._app, self._route = app, app.find_handler
        app.find_handler = self.find_handler  # the instance's attribute: the class's own method stays below it
        keep_strangers_off_console()  # the scheduler's (and, in a LocalCluster, the nannies') refused connections
        self.token_file = _write_token_file(self.token, port)

    async def close(self) -> None:
        # The guard stays in front of the routing: Dask closes the plugins before it stops the HTTP server, and the
        # routing given back here served every page to anyone until then (found by a second user polling the port)
        if self.token_file is not None:
            with contextlib.suppress(OSError):
                if self.token_file.read_text() == self.token:  # not a later scheduler's on the same port
                    self.token_file.unlink()

    def __getstate__(self) -> dict[str, Any]:  # a copy (a cluster dump) carries neither the token nor the server
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    # -- every request ---------------------------------------------------------------------------------------------

    def find_handler(self, request: httputil.HTTPServerRequest, **kwargs: Any) -> Any:
        app = self._app
        if not _same_origin(request):
            return app.get_handler_delegate(request, _Refused)
        given = _query_token(request)
        if given is not None and self._matches(given):
            if request.method in ("GET", "HEAD"):  # a browser's first visit: the cookie, then the address without it
                return app.get_handler_delegate(request, _SetCookie, {
                    "cookie": self.cookie, "token": self.token, "location": _without_token(request)})
            return self._route(request, **kwargs)
        if self._matches(_bearer(request)) or self._matches(_cookie(request, self.cookie)):
            return self._route(request, **kwargs)
        return app.get_handler_delegate(request, _Refused)

    def _matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())


def guard_pages(scheduler: Any) -> PageGuard:
    """The scheduler's PageGuard, installed now when it has none (the one its HTTP server's start put in, if any)."""
    guard = scheduler.plugins.get(PageGuard.name)
    if guard is None:
        guard = _guarded_at_http_start.pop(scheduler, None) or PageGuard()
        scheduler.add_plugin(guard, name=PageGuard.name)
    guard.install(scheduler)
    return guard


# Schedulers whose pages were guarded as their HTTP server started, until their preload registers the guard.
_guarded_at_http_start: weakref.WeakKeyDictionary[Any, PageGuard] = weakref.WeakKeyDictionary()


def guard_from_the_http_start(preload: str) -> None:
    """From now on, in this process, a scheduler that preloads `preload` guards its pages as its HTTP server starts.
    Dask starts that server in the scheduler's constructor and runs the preloads only at its start, after its comm
    listener: in between, pages were answered to anyone (shown by tests/test_security_pages.py). The constructor
    imports the preloads first, so the module named `preload` calls this at its import, in time."""
    from distributed import Scheduler

    if getattr(Scheduler.start_http_server, "guards_preload", None) == preload:
        return
    start_http_server = Scheduler.start_http_server

    def guarded_start_http_server(self: Any, *args: Any, **kwargs: Any) -> None:
        start_http_server(self, *args, **kwargs)
        if any(getattr(p, "name", None) == preload for p in getattr(self, "preloads", ())):
            guard = _guarded_at_http_start[self] = PageGuard()
            guard.install(self)

    guarded_start_http_server.guards_preload = preload  # type: ignore[attr-defined]
    Scheduler.start_http_server = guarded_start_http_server  # only Scheduler's: workers and nannies keep Dask's


def page_token(dask_scheduler: Any) -> str:
    """`client.run_on_scheduler(page_token)`: the token of the scheduler's pages (guarding them first if need be)."""
    return guard_pages(dask_scheduler).token


def page_access(dask_scheduler: Any) -> tuple[str, str, int]:
    """`client.run_on_scheduler(page_access)`: (token, the address the pages are bound to, their port)."""
    return page_token(dask_scheduler), str(dask_scheduler.http_server.address), int(dask_scheduler.http_server.port)


def tunnel_friendly(link: str, bound: str, port: int) -> str:
    """Dask's dashboard link, at http://127.0.0.1:PORT when the pages listen on loopback or on every address (what
    `ssh -L PORT:localhost:PORT node` reaches); a server bound to one other address keeps its link."""
    if bound not in ("127.0.0.1", "localhost", "0.0.0.0", "", "::"):
        return link
    parts = urlsplit(link)
    return urlunsplit(("http", f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment))


def stop_pages(dask_scheduler: Any) -> None:
    """`client.run_on_scheduler(stop_pages)`: the scheduler's HTTP server stops listening (Dask starts one even
    without a dashboard: its JSON, /info pages and /metrics). Guarded first, for what was already accepted."""
    guard_pages(dask_scheduler)
    dask_scheduler.http_server.stop()


def stop_worker_pages(dask_worker: Any) -> None:
    """A worker's own HTTP server stops listening. Dask starts one in every worker, with no dashboard too: /metrics
    (the process's memory, CPU, open files and tasks), /health and /sitemap.json, answered to every user of the node.
    Nothing of uni-agent reads it: the scheduler's /metrics (behind the token) covers the cluster."""
    server = getattr(dask_worker, "http_server", None)
    if server is not None:
        server.stop()


def with_token(url: str, token: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{urlencode({TOKEN_PARAMETER: token})}"


# -- the request's credentials ---------------------------------------------------------------------------------------


def _query_token(request: httputil.HTTPServerRequest) -> str | None:
    values = request.query_arguments.get(TOKEN_PARAMETER)
    return values[-1].decode("utf-8", "replace") if values else None


def _bearer(request: httputil.HTTPServerRequest) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _cookie(request: httputil.HTTPServerRequest, name: str) -> str | None:
    morsel = request.cookies.get(name)  # tornado answers {} for a header it cannot parse
    return None if morsel is None else morsel.value


def _same_origin(request: httputil.HTTPServerRequest) -> bool:
    """No Origin (a scraper, a page's own GET), or this server's. Cookies ignore ports, and SameSite counts every
    port of 127.0.0.1 as the same site: a page another user serves on another port, opened in the user's browser,
    could otherwise open bokeh's websocket (Dask allows any origin) with the user's cookie and read it."""
    origin = request.headers.get("Origin")
    return origin is None or urlsplit(origin).netloc == request.host


def _without_token(request: httputil.HTTPServerRequest) -> str:
    rest = [(k, v) for k, v in parse_qsl(request.query, keep_blank_values=True) if k != TOKEN_PARAMETER]
    path = "/" + request.path.lstrip("/")  # never "//host": a redirect stays on this server
    return path + ("?" + urlencode(rest) if rest else "")


class _SetCookie(web.RequestHandler):
    def initialize(self, cookie: str, token: str, location: str) -> None:
        self.cookie, self.token, self.location = cookie, token, location

    def get(self) -> None:
        self.set_cookie(self.cookie, self.token, path="/", httponly=True, samesite="Strict")
        self.set_header("Cache-Control", "no-store")
        self.redirect(self.location)

    head = get


class _Refused(web.RequestHandler):
    """403, whatever the method: no route, no reason, no server header worth reading."""

    def prepare(self) -> None:
        self.clear_header("Server")
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_status(403)
        self.finish("403: Forbidden\n")


# -- the token file --------------------------------------------------------------------------------------------------


def token_file(port: int, host: str | None = None) -> Path:
    """Where the scheduler on `host` (default: this one) serving on `port` keeps its pages' token."""
    return Path(TOKEN_DIR).expanduser() / f"{host or socket.gethostname()}-{port}.token"


def _write_token_file(token: str, port: int) -> Path | None:
    """The token into token_file(port): a private directory, the file 0600, written whole under a temporary name.
    A home that cannot take it costs the scrapers their file, not the run its pages (the link carries the token)."""
    path = token_file(port)
    try:
        ensure_private_dir(path.parent, parents=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, token.encode())
        finally:
            os.close(fd)
        os.replace(partial, path)
    except Exception as exc:  # UnsafeDirectory (someone else's directory) or OSError
        logger.warning("the dashboard's token file %s was not written: %s", path, exc)
        return None
    return path
