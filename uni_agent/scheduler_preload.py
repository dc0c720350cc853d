"""uni-agent's scheduler extension, loaded with `dask scheduler --preload uni_agent.scheduler_preload`.

It installs the GPU lease table (uni_agent.engines.placement.GpuLeases) when the scheduler starts, so every driver that
connects shares one record of which GPU devices hold an engine, and the uni-agent page (/uni-agent), so it is there
before any driver connects. Drivers also register both themselves when missing, so the preload is recommended,
not required. Its first step puts the scheduler's pages behind a token (uni_agent.dashboard.guard): made here,
written to ~/.config/uni-agent/dashboard/<host>-<port>.token (0600) for scrapers, and fetched by each driver over
the authenticated comm to print the link. It also asks the workers for fewer heartbeats (uni_agent.dask_timers).
"""

from __future__ import annotations

from typing import Any

from .dashboard.guard import guard_from_the_http_start, guard_pages
from .dashboard.plugin import dask_setup as install_dashboard
from .dask_timers import slow_heartbeats
from .engines.placement import GpuLeases

# Imported by the scheduler's constructor before it starts its HTTP server: the pages are guarded from that start,
# not only from dask_setup (which Dask runs later, once the scheduler starts).
guard_from_the_http_start(__name__)


def dask_setup(scheduler: Any) -> None:
    guard_pages(scheduler)
    scheduler.add_plugin(GpuLeases(), idempotent=True)
    install_dashboard(scheduler)
    slow_heartbeats(scheduler)
