"""uni-agent's scheduler extension, loaded with `dask scheduler --preload uni_agent.scheduler_preload`.

It installs the GPU lease table (uni_agent.engines.placement.GpuLeases) when the scheduler starts, so every driver that
connects shares one record of which GPU devices hold an engine, and the uni-agent page (/uni-agent), so it is there
before any driver connects. Drivers also register both themselves when missing, so the preload is recommended,
not required.
"""

from __future__ import annotations

from typing import Any

from .dashboard.plugin import dask_setup as install_dashboard
from .engines.placement import GpuLeases


def dask_setup(scheduler: Any) -> None:
    scheduler.add_plugin(GpuLeases(), idempotent=True)
    install_dashboard(scheduler)
