"""Watch a run live: a page and Prometheus metrics served by the Dask scheduler, fed by rollout events.

`UniAgentDashboard` is the scheduler plugin (the driver registers it for every run; `dask scheduler --preload
uni_agent.dashboard` installs it with the scheduler); `DashboardState` is the pure fold behind it.
"""

from .plugin import PAGE, UniAgentDashboard, dask_setup, page_url
from .state import DashboardState

__all__ = ["PAGE", "DashboardState", "UniAgentDashboard", "dask_setup", "page_url"]
