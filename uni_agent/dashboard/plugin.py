"""The scheduler plugin: folds uni-agent events into live state and serves it from the scheduler's own HTTP server.

    await client.register_plugin(UniAgentDashboard())   # the driver does this for every run (idempotent)
    dask scheduler --preload uni_agent.dashboard                         # or install it with the scheduler

Routes, next to Dask's dashboard (same host and port, so the same bind address: the driver's LocalCluster binds
127.0.0.1; a `dask scheduler` binds where its `--dashboard-address` says):

    /uni-agent                                         the page (self-contained HTML, polls the JSON below)
    /uni-agent/api/state.json?run=RUN_ID&limit=200     one run's live state (default: the newest run)
    /uni-agent/api/rollout/RUN_ID/INSTANCE_ID/K.json   one rollout: state history, trajectory, verification

and Prometheus metrics named `uni_agent_*` on the scheduler's `/metrics`. Wherever the page is installed, the
scheduler's whole HTTP server answers only requests that carry its token (uni_agent.dashboard.guard).
"""

from __future__ import annotations

import json
import logging
import math
import time
import weakref
from collections.abc import Iterator
from importlib import resources
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web

from ..events import PAGE_TRAJECTORIES, TOPIC
from .guard import guard_pages
from .records import SANDBOX_BUCKETS
from .state import DashboardState

logger = logging.getLogger("uni_agent.dashboard")
PAGE = "uni-agent"


class UniAgentDashboard(SchedulerPlugin):
    """One per scheduler: the name is fixed and the plugin idempotent, so registering it again is a no-op."""

    name = "uni-agent-dashboard"
    idempotent = True

    def __init__(self, max_runs: int = 50, max_trajectories: int = PAGE_TRAJECTORIES, prefix: str = "/"):
        self.max_runs, self.max_trajectories, self.prefix = max_runs, max_trajectories, prefix
        self.state = DashboardState(max_runs, max_trajectories)
        self.scheduler: Any = None
        self._app: web.Application | None = None

    async def start(self, scheduler: Any) -> None:  # no await inside: no event can slip in between catch-up and use
        self.scheduler = scheduler
        if self.state.totals.events == 0:  # registered mid-run: fold what the scheduler already holds
            for _, msg in scheduler.get_events(TOPIC):
                self.state.apply(msg)
        http = getattr(scheduler, "http_application", None)
        if http is not None:
            guard_pages(scheduler)  # the page holds prompts and hidden tests: never served without the token
            self._app = web.Application(routes(self, self.prefix))
            http.add_application(self._app)
            _link_from_dask_dashboard(scheduler)
        _COLLECTOR.add(self)
        logger.info("uni-agent page at %s%s", self.prefix, PAGE)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == TOPIC:
            self.state.apply(msg)

    async def close(self) -> None:
        http = getattr(self.scheduler, "http_application", None)
        if http is not None and self._app in http.applications:
            http.applications.remove(self._app)
        _COLLECTOR.discard(self)

    def __getstate__(self) -> dict[str, Any]:  # what travels from the driver: settings, not state
        return {"max_runs": self.max_runs, "max_trajectories": self.max_trajectories, "prefix": self.prefix}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    # -- what the handlers serve -----------------------------------------------------------------------------------

    def state_json(self, run_id: str | None, limit: int = 200) -> str:
        return _dumps(self.state.snapshot(run_id, now=time.time(), limit=limit))

    def rollout_json(self, run_id: str, instance_id: str, rollout: int) -> str | None:
        detail = self.state.rollout_detail(run_id, instance_id, rollout)
        return None if detail is None else _dumps(detail)


def dask_setup(scheduler: Any) -> None:
    """`dask scheduler --preload uni_agent.dashboard.plugin`: the page exists before any driver connects, and the
    scheduler's pages need the token from the start."""
    guard_pages(scheduler)
    scheduler.add_plugin(UniAgentDashboard(), idempotent=True)


def page_url(dashboard_link: str | None) -> str | None:
    """The uni-agent page next to a Dask dashboard link (http://host:port/status → http://host:port/uni-agent)."""
    if not dashboard_link:
        return None
    from urllib.parse import urljoin

    return urljoin(dashboard_link, PAGE)


# -- HTTP ------------------------------------------------------------------------------------------------------------


class _Handler(web.RequestHandler):
    def initialize(self, plugin: UniAgentDashboard) -> None:
        self.plugin = plugin

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")

    def _json(self, body: str) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.write(body)


class PageHandler(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(_page_html())


class StateHandler(_Handler):
    def get(self) -> None:
        try:
            limit = max(0, min(5000, int(self.get_argument("limit", "200"))))
        except ValueError:
            raise web.HTTPError(400, "limit must be an integer") from None
        self._json(self.plugin.state_json(self.get_argument("run", None) or None, limit))


class RolloutHandler(_Handler):
    def get(self, run_id: str, instance_id: str, rollout: str) -> None:
        body = self.plugin.rollout_json(run_id, instance_id, int(rollout))
        if body is None:
            raise web.HTTPError(404, f"no rollout {instance_id} #{rollout} in run {run_id}")
        self._json(body)


def routes(plugin: UniAgentDashboard, prefix: str = "/") -> list[tuple[str, type, dict[str, Any]]]:
    base = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    page = base + PAGE
    kwargs = {"plugin": plugin}
    return [
        (page, PageHandler, kwargs),
        (page + "/", web.RedirectHandler, {"url": page}),  # the page's relative links need the slash-less form
        (page + "/api/state.json", StateHandler, kwargs),
        (page + r"/api/rollout/([^/]+)/([^/]+)/(\d+)\.json", RolloutHandler, kwargs),
    ]


_PAGE_CACHE: list[str] = []


def _page_html() -> str:
    if not _PAGE_CACHE:
        _PAGE_CACHE.append(resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8"))
    return _PAGE_CACHE[0]


def _dumps(obj: Any) -> str:
    return json.dumps(_finite(obj), separators=(",", ":"), default=str)


def _finite(obj: Any) -> Any:
    """JSON for browsers: NaN and infinities become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _link_from_dask_dashboard(scheduler: Any) -> None:
    """Add "Uni-Agent" to the Dask dashboard's navigation bar. Bokeh pages only, and an internal Dask API: a
    missing bokeh or a changed API just means no link (the page itself does not depend on it)."""
    try:
        from distributed.dashboard.scheduler import template_variables

        pages = template_variables(scheduler)["pages"]
        if PAGE not in pages:
            pages.append(PAGE)
    except Exception as exc:  # ImportError without bokeh; anything else is a Dask internals change
        logger.debug("no link from the Dask dashboard: %r", exc)


# -- Prometheus ------------------------------------------------------------------------------------------------------


class _Collector:
    """One collector per process in prometheus_client's global registry (which the scheduler's /metrics serves),
    reading every live plugin of the process at scrape time. There is one plugin per scheduler, and normally one
    scheduler per process; with several (tests), values are summed."""

    def __init__(self) -> None:
        self.plugins: weakref.WeakSet[UniAgentDashboard] = weakref.WeakSet()
        self.registered = False

    def add(self, plugin: UniAgentDashboard) -> None:
        self.plugins.add(plugin)
        if not self.registered:
            try:
                from prometheus_client import REGISTRY
            except ImportError:
                logger.warning("prometheus_client is not installed: no uni_agent_* metrics on /metrics")
                return
            REGISTRY.register(self)
            self.registered = True

    def discard(self, plugin: UniAgentDashboard) -> None:
        self.plugins.discard(plugin)

    def describe(self) -> list[Any]:
        return []  # names come from collect(); nothing to check against other collectors at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        states = [p.state for p in list(self.plugins)]
        gauges = [s.gauges() for s in states]

        rollouts = GaugeMetricFamily("uni_agent_rollouts", "Rollouts in each state (runs held by the dashboard)",
                                     labels=["state"])
        for state in gauges[0]["counts"] if gauges else ():
            rollouts.add_metric([state], sum(g["counts"][state] for g in gauges))
        yield rollouts

        in_sandbox = GaugeMetricFamily("uni_agent_worker_rollouts_in_sandbox",
                                       "Rollouts starting a sandbox or running turns, per Dask worker",
                                       labels=["worker"])
        for worker in sorted({w for g in gauges for w in g["in_sandbox"]}):
            in_sandbox.add_metric([worker], sum(g["in_sandbox"].get(worker, 0) for g in gauges))
        yield in_sandbox

        latest = [g["latest_avg_reward"] for g in gauges if g["latest_avg_reward"] is not None]
        avg = GaugeMetricFamily("uni_agent_avg_reward", "Mean reward of the newest run's finished rollouts")
        if latest:
            avg.add_metric([], latest[-1])
        yield avg

        finished = CounterMetricFamily("uni_agent_rollouts_finished", "Finished rollouts by exit reason",
                                       labels=["exit_reason"])
        for reason in sorted({r for s in states for r in s.totals.finished}):
            finished.add_metric([reason], sum(s.totals.finished[reason] for s in states))
        yield finished

        errors = CounterMetricFamily("uni_agent_rollout_errors", "Finished rollouts with an error, by kind",
                                     labels=["kind"])
        for kind in sorted({k for s in states for k in s.totals.errors}):
            errors.add_metric([kind], sum(s.totals.errors[kind] for s in states))
        yield errors

        yield CounterMetricFamily("uni_agent_turns", "Agent turns started (LLM calls)",
                                  value=sum(s.totals.turns for s in states))
        yield CounterMetricFamily("uni_agent_reward", "Sum of the rewards of finished rollouts",
                                  value=sum(s.totals.reward_sum for s in states))
        yield CounterMetricFamily("uni_agent_rollouts_resolved", "Finished rollouts that resolved their task",
                                  value=sum(s.totals.resolved for s in states))
        yield CounterMetricFamily("uni_agent_events", "uni-agent events received by the scheduler",
                                  value=sum(s.totals.events for s in states))

        buckets, cumulative = [], 0
        for i, bound in enumerate(SANDBOX_BUCKETS):
            cumulative = sum(s.totals.sandbox_buckets[i] for s in states)
            buckets.append((repr(bound), cumulative))
        count = sum(s.totals.sandbox_count for s in states)
        buckets.append(("+Inf", count))
        yield HistogramMetricFamily("uni_agent_sandbox_start_seconds", "Sandbox start latency of finished rollouts",
                                    buckets=buckets, sum_value=sum(s.totals.sandbox_sum for s in states))


_COLLECTOR = _Collector()
