"""Watch a run live: a page and Prometheus metrics served by the Dask scheduler, fed by rollout events.

`UniAgentDashboard` is the scheduler plugin (the driver registers it for every run; `dask scheduler --preload
uni_agent.dashboard` installs it with the scheduler); `DashboardState` is the pure fold behind it; `PageGuard` puts
every page of the scheduler behind the run's token (`page_token` fetches it, `with_token` adds it to a link).
"""

from .guard import PageGuard, page_access, page_token, stop_pages, token_file, tunnel_friendly, with_token
from .plugin import PAGE, UniAgentDashboard, dask_setup, page_url
from .state import DashboardState

__all__ = ["PAGE", "DashboardState", "PageGuard", "UniAgentDashboard", "dask_setup", "page_access", "page_token",
           "page_url", "stop_pages", "token_file", "tunnel_friendly", "with_token"]
